"""AsyncLLM: concurrent requests through one engine thread give what LLM.generate gives;
leaving a generator early aborts only that request."""
import asyncio

import pytest

from conftest import ENGINE_ARGS, MODEL
from kaon import AsyncLLM, SamplingParams

PROMPTS = ["The capital of France is", "Once upon a time", "def add(a, b):", "Water boils at"]


@pytest.fixture(scope="module")
def async_llm():
    e = AsyncLLM(MODEL, **ENGINE_ARGS)
    yield e
    e.shutdown()


def test_concurrent_streams_equal_generate(async_llm, llm):
    sp = SamplingParams(temperature=0, max_tokens=16)

    async def one(i, p):
        updates, last = 0, None
        async for out in async_llm.generate(p, sp, request_id=f"r{i}"):
            updates += 1
            last = out
        return updates, last

    async def main():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(PROMPTS)))

    results = asyncio.run(main())
    want = llm.generate(PROMPTS, sp)
    for (updates, last), w, i in zip(results, want, range(len(PROMPTS))):
        assert last.finished and last.request_id == f"r{i}"
        assert last.outputs[0].token_ids == w.outputs[0].token_ids
        assert last.outputs[0].text == w.outputs[0].text
        assert updates > 1  # streamed, not one final answer


def test_break_aborts_one_request(async_llm):
    async def main():
        long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
        short = SamplingParams(temperature=0, max_tokens=8)

        async def quit_early():
            async for out in async_llm.generate("Count:", long):
                if len(out.outputs[0].token_ids) >= 3:
                    break
            return "left"

        async def full():
            last = None
            async for out in async_llm.generate("Hello", short):
                last = out
            return last

        return await asyncio.wait_for(asyncio.gather(quit_early(), full()), 60)

    left, last = asyncio.run(main())
    assert left == "left" and last.finished and len(last.outputs[0].token_ids) == 8
    assert not async_llm._streams  # every request freed
