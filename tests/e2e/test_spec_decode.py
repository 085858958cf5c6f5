"""Speculative decoding through a real `kaon serve` on the default model, with the official
openai client: a server with n-gram drafts answers exactly as one without (greedy, seeded
sampling with logprobs and n > 1, streamed), and /metrics counts the drafts."""
import json
import re

import pytest

from conftest import API_KEY, Server

SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2})
COMMON = ["--api-key", API_KEY, "--max-model-len", "1024", "--kv-cache-memory", "128M",
          "--served-model-name", "smol"]

# The model copies text it was asked to repeat: drafts from the prompt are mostly right.
REPEAT = ("Repeat the following list exactly, one item per line, and nothing else:\n"
          "alpha bravo charlie\ndelta echo foxtrot\ngolf hotel india\njuliett kilo lima\n"
          "mike november oscar\npapa quebec romeo\n")


@pytest.fixture(scope="module")
def servers():
    plain = Server(COMMON)
    spec = Server(COMMON + ["--speculative-config", SPEC])
    yield plain, spec
    for s in (plain, spec):
        s.stop()
        assert s.proc.returncode == 0, s.output()


def client_for(server):
    import openai
    return openai.OpenAI(base_url=server.base + "/v1", api_key=API_KEY, max_retries=0, timeout=300)


def counter(server, name):
    m = re.search(r"^" + re.escape(name) + r"\{[^}]*\} ([0-9.e+]+)$", server.metrics(), re.M)
    assert m, name
    return float(m.group(1))


def test_greedy_chat_same_and_drafts_accepted(servers):
    plain, spec = servers
    before = counter(spec, "kaon:spec_decode_num_accepted_tokens_total")
    msgs = [{"role": "user", "content": REPEAT}]
    a = client_for(plain).chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=80)
    b = client_for(spec).chat.completions.create(model="smol", messages=msgs, temperature=0, max_tokens=80)
    assert b.choices[0].message.content == a.choices[0].message.content
    assert b.usage.completion_tokens == a.usage.completion_tokens
    assert "golf hotel india" in b.choices[0].message.content
    accepted = counter(spec, "kaon:spec_decode_num_accepted_tokens_total") - before
    assert accepted >= a.usage.completion_tokens // 3, accepted
    drafted = counter(spec, "kaon:spec_decode_num_draft_tokens_total")
    assert drafted >= accepted and counter(spec, "kaon:spec_decode_num_drafts_total") > 0
    pos0 = spec.metrics()
    assert 'kaon:spec_decode_num_accepted_tokens_per_pos_total{model_name="smol",position="0"}' in pos0
    # The plain server proposes nothing.
    assert counter(plain, "kaon:spec_decode_num_draft_tokens_total") == 0


def test_seeded_sampling_with_logprobs_and_n_same(servers):
    plain, spec = servers
    kw = dict(model="smol", messages=[{"role": "user", "content": REPEAT}], temperature=0.7, top_p=0.95,
              max_tokens=60, seed=1234, n=2, logprobs=True, top_logprobs=3, frequency_penalty=0.2)
    a = client_for(plain).chat.completions.create(**kw)
    b = client_for(spec).chat.completions.create(**kw)
    assert len(a.choices) == len(b.choices) == 2
    for ca, cb in zip(a.choices, b.choices):
        assert cb.message.content == ca.message.content
        la = [(t.token, round(t.logprob, 4), [(x.token, round(x.logprob, 4)) for x in t.top_logprobs])
              for t in ca.logprobs.content]
        lb = [(t.token, round(t.logprob, 4), [(x.token, round(x.logprob, 4)) for x in t.top_logprobs])
              for t in cb.logprobs.content]
        assert lb == la


def test_streamed_completion_same(servers):
    plain, spec = servers
    before = counter(spec, "kaon:spec_decode_num_accepted_tokens_total")
    prompt = "1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2,"
    a = client_for(plain).completions.create(model="smol", prompt=prompt, temperature=0, max_tokens=48)
    chunks = client_for(spec).completions.create(model="smol", prompt=prompt, temperature=0, max_tokens=48,
                                                 stream=True)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == a.choices[0].text
    assert counter(spec, "kaon:spec_decode_num_accepted_tokens_total") > before


def test_bad_config_refused_at_start():
    import subprocess
    from conftest import MODEL, kaon_binary
    r = subprocess.run([str(kaon_binary()), "serve", str(MODEL), "--speculative-config", '{"method": "mtp"}'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "speculative" in r.stderr, r.stderr


def test_structured_output_same_with_drafts(servers):
    """A grammar-constrained request verifies drafts too: each position is masked by the
    matcher as it stands after the drafts kept before it (no rollback needed)."""
    plain, spec = servers
    before = counter(spec, "kaon:spec_decode_num_draft_tokens_total")
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"},
                                                         "minItems": 6, "maxItems": 6}},
              "required": ["items"], "additionalProperties": False}
    kw = dict(model="smol", messages=[{"role": "user", "content": REPEAT + "\nAnswer as JSON: the first six words."}],
              temperature=0, max_tokens=120,
              response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": schema, "strict": True}})
    a = client_for(plain).chat.completions.create(**kw)
    b = client_for(spec).chat.completions.create(**kw)
    assert b.choices[0].message.content == a.choices[0].message.content
    items = json.loads(b.choices[0].message.content)["items"]
    assert len(items) == 6
    assert counter(spec, "kaon:spec_decode_num_draft_tokens_total") > before
