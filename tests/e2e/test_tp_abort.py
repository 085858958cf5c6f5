"""A served tensor-parallel engine whose rank fails a step (KAON_TP_FAIL=R:S, a test aid: rank R
fails its step S before any collective): the request in that step gets an OpenAI error (500,
naming the rank), the server stays up, and the next request runs on every rank again with the
tokens of a one-rank server (tests/ref/test_tp_abort.py covers the runner's side)."""
import openai

from conftest import Server

MODEL_NAME = "smol"
ARGS = ["--served-model-name", MODEL_NAME, "--max-model-len", "1024", "--kv-cache-memory", "64M", "--threads", "2"]
PROMPT = "The capital of France is"


def complete(s):
    c = openai.OpenAI(base_url=s.base + "/v1", api_key="none", max_retries=0, timeout=120)
    return c.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=12, temperature=0)


def test_failed_step_fails_its_request_only():
    one = Server(ARGS)
    try:
        want = complete(one).choices[0].text
    finally:
        one.stop()
    s = Server(ARGS + ["-tp", "3"], env={"KAON_TP_FAIL": "2:2"})  # (9 heads: 3 ranks)
    try:
        try:
            complete(s)
            raise AssertionError("the request of the failed step succeeded")
        except openai.InternalServerError as e:
            assert "rank 2: injected failure" in str(e), str(e)
        assert s.request("GET", "/health")[0] == 200
        got = complete(s)
        assert got.choices[0].text == want
        assert got.choices[0].finish_reason == "length"
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.output()
