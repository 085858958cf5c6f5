"""The package's own behaviour: prompt forms, streaming, sampling parameters and their checks,
stops, logprobs, the tokenizer, bad inputs."""
import pytest

from conftest import ENGINE_ARGS, MODEL
from kaon import LLM, RequestOutput, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def test_prompt_forms(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode("The capital of France is")
    a = llm.generate("The capital of France is", GREEDY)
    b = llm.generate(ids, GREEDY)
    c = llm.generate([{"prompt_token_ids": ids}, {"prompt": "The capital of France is"}], GREEDY)
    assert isinstance(a[0], RequestOutput) and a[0].prompt_token_ids == ids
    assert b[0].prompt is None and b[0].prompt_token_ids == ids
    assert a[0].outputs[0].token_ids == b[0].outputs[0].token_ids == c[0].outputs[0].token_ids == c[1].outputs[0].token_ids
    assert len({o.request_id for o in c}) == 2


def test_stream_equals_generate(llm):
    prompts = ["Once upon a time", "The quick brown fox"]
    sp = SamplingParams(temperature=0, max_tokens=24)
    final, seen = {}, {}
    for out in llm.generate_stream(prompts, sp):
        prev = seen.get(out.request_id, [])
        assert out.outputs[0].token_ids[:len(prev)] == prev  # cumulative
        seen[out.request_id] = out.outputs[0].token_ids
        if out.finished:
            final[out.request_id] = out
    assert len(final) == 2 and len(seen) == 2
    want = llm.generate(prompts, sp)
    got = sorted(final.values(), key=lambda o: int(o.request_id))
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    assert [o.outputs[0].text for o in got] == [o.outputs[0].text for o in want]


def test_stream_closed_early_aborts(llm):
    it = llm.generate_stream("Count to a thousand:", SamplingParams(temperature=0, max_tokens=500, ignore_eos=True))
    first = next(it)
    assert not first.finished
    it.close()
    assert llm.generate("Hi", GREEDY)[0].finished  # still usable


def test_sampling_seed_n_and_batch_params(llm):
    sp = SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=7, max_tokens=16, n=2)
    a, b = llm.generate("Tell me a story", sp)[0], llm.generate("Tell me a story", sp)[0]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert [o.index for o in a.outputs] == [0, 1] and a.outputs[0].token_ids != a.outputs[1].token_ids
    outs = llm.generate(["a", "b"], [SamplingParams(temperature=0, max_tokens=3), SamplingParams(temperature=0, max_tokens=5)])
    assert [len(o.outputs[0].token_ids) for o in outs] == [3, 5]


def test_stops_and_logprobs(llm):
    base = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=12))[0].outputs[0]
    assert base.finish_reason == "length" and base.text.startswith(" 5, 6")
    s = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=12, stop=" 6"))[0].outputs[0]
    assert s.text == " 5," and s.finish_reason == "stop" and s.stop_reason == " 6"
    tid = base.token_ids[1]
    t = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[tid]))[0].outputs[0]
    assert t.finish_reason == "stop" and t.stop_reason == tid and t.token_ids[-1] == tid
    lp = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=4, logprobs=3))[0].outputs[0]
    assert len(lp.logprobs) == 4 and all(len(d) == 3 for d in lp.logprobs)
    first = lp.logprobs[0][lp.token_ids[0]]
    assert first.rank == 1 and first.decoded_token == llm.get_tokenizer().decode([lp.token_ids[0]])
    assert lp.cumulative_logprob == pytest.approx(sum(d[t].logprob for d, t in zip(lp.logprobs, lp.token_ids)))
    assert base.logprobs is None and base.cumulative_logprob is None
    biased = llm.generate("1, 2, 3, 4,", SamplingParams(temperature=0, max_tokens=3, logit_bias={base.token_ids[0]: -100}))
    assert biased[0].outputs[0].token_ids[0] != base.token_ids[0]


@pytest.mark.parametrize("kw", [
    dict(n=0), dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2), dict(min_p=2),
    dict(max_tokens=0), dict(min_tokens=5, max_tokens=2), dict(stop=""), dict(stop=[1]),
    dict(stop_token_ids=[-1]), dict(presence_penalty=3), dict(repetition_penalty=0), dict(logprobs=-1),
    dict(logit_bias={1: 500}), dict(seed=-1), dict(best_of=3), dict(logits_processors=[print]),
    dict(bad_words=["x"]), dict(ignore_eos="yes"),
])
def test_sampling_params_rejects(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        SamplingParams(**kw)


def test_changed_params_are_checked_at_submit(llm):
    sp = SamplingParams(temperature=0)
    sp.top_p = 7
    with pytest.raises(ValueError, match="top_p"):
        llm.generate("x", sp)


def test_tokenizer(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode("Hello, wörld!")
    assert tok.decode(ids) == "Hello, wörld!"
    assert tok.eos_token_id == 2 and 2 in tok.stop_token_ids
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([10**8])


def test_bad_inputs(llm):
    with pytest.raises(ValueError, match="empty"):
        llm.generate([[]], GREEDY)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.generate([10**8], GREEDY)
    with pytest.raises(ValueError, match="refused"):
        llm.generate([[5] * 2000], GREEDY)  # longer than max_model_len
    with pytest.raises(ValueError, match="role"):
        llm.chat([{"content": "no role"}])
    with pytest.raises(FileNotFoundError):
        LLM("/nonexistent/model.gguf")
    with pytest.raises(TypeError, match="unknown engine argument"):
        LLM(MODEL, no_such_arg=1)
    with pytest.raises(ValueError, match="dtype"):
        LLM(MODEL, dtype="float16", **ENGINE_ARGS)
    assert llm.generate("Hi", GREEDY)[0].finished


def test_package_versions():
    import re

    import kaon
    from conftest import ROOT
    h = open(f"{ROOT}/include/kaon.h").read()
    want = ".".join(re.search(rf"#define KAON_VERSION_{p} (\d+)", h).group(1) for p in ("MAJOR", "MINOR", "PATCH"))
    assert kaon.library_version == want == kaon.__version__
    assert re.search(r'^version = "(.*?)"', open(f"{ROOT}/pyproject.toml").read(), re.M).group(1) == want
