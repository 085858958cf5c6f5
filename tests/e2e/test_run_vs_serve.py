"""`kaon run` and `kaon serve` are one path to the engine: for the same prompt and parameters,
`kaon run --print-ids` and /v1/completions (through the official openai client, asking for the
token ids with vLLM's `return_token_ids`) give the same tokens, and the same text. Greedy,
penalties, stop strings, logit_bias, and seeded sampling with top_k / top_p / min_p.

Each case also checks it is not vacuous: the penalties, the bias, the stop strings and the
sampling really change the output against greedy decoding of the same prompt.
"""
import functools
import subprocess

import pytest

from conftest import MODEL, kaon_binary

MODEL_NAME = "smol"
MAX_TOKENS = 16
PROMPTS = ["The capital of France is", "def fibonacci(n):"]

# name -> parameters, in the API's names (logit_bias is filled per prompt from its greedy run).
# Each penalty has a case of its own, so a front end that dropped one would be caught.
CASES = {
    "greedy": dict(temperature=0),
    "repetition": dict(temperature=0, repetition_penalty=1.3),
    "presence": dict(temperature=0, presence_penalty=1.5),
    "frequency": dict(temperature=0, frequency_penalty=1.5),
    "stop": dict(temperature=0, stop=[".", " the", "return"]),
    "logit_bias": dict(temperature=0),
    "seeded": dict(temperature=0.9, top_k=40, top_p=0.9, min_p=0.05, seed=1234),
    "seeded_penalties": dict(temperature=1.1, top_p=0.95, seed=7, repetition_penalty=1.1,
                             presence_penalty=0.3, frequency_penalty=0.5),
}

CLI_FLAGS = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
             "seed": "--seed", "repetition_penalty": "--repeat-penalty",
             "presence_penalty": "--presence-penalty", "frequency_penalty": "--frequency-penalty"}
EXTRA_BODY = ("top_k", "min_p", "repetition_penalty")  # kaon / vLLM fields the client lacks


def cli_args(params):
    args = []
    for k, v in params.items():
        if k == "stop":
            for s in v:
                args += ["--stop", s]
        elif k == "logit_bias":
            for tok, bias in v.items():
                args += ["--logit-bias", f"{tok}={bias}"]
        else:
            args += [CLI_FLAGS[k], str(v)]
    return args


@functools.lru_cache(maxsize=None)
def kaon_run(prompt, args, print_ids):
    cmd = [str(kaon_binary()), "run", "-m", str(MODEL), "-p", prompt, "-n", str(MAX_TOKENS), *args]
    if print_ids:
        cmd.append("--print-ids")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "kaon: prompt" in r.stderr  # the speeds line
    if print_ids:
        return tuple(int(x) for x in r.stdout.strip().strip("[]").split(",") if x.strip())
    assert r.stdout.endswith("\n")
    return r.stdout[:-1]


def params_of(case, prompt):
    params = dict(CASES[case])
    if case == "logit_bias":
        greedy = kaon_run(prompt, tuple(cli_args(CASES["greedy"])), True)
        # Ban the greedy first token and favour the third one: the output must change.
        params["logit_bias"] = {greedy[0]: -100, greedy[2]: 5}
    return params


def serve(client, prompt, params, stream=False):
    kw = {k: v for k, v in params.items() if k not in EXTRA_BODY}
    extra = {k: v for k, v in params.items() if k in EXTRA_BODY}
    if "logit_bias" in kw:
        kw["logit_bias"] = {str(t): b for t, b in kw["logit_bias"].items()}
    extra["return_token_ids"] = True
    r = client.completions.create(model=MODEL_NAME, prompt=prompt, max_tokens=MAX_TOKENS, stream=stream,
                                  extra_body=extra, **kw)
    if stream:
        ids, text = [], ""
        for chunk in r:
            for c in chunk.choices:
                ids += c.model_extra.get("token_ids") or []
                text += c.text
        return tuple(ids), text
    c = r.choices[0]
    assert c.model_extra["prompt_token_ids"]  # the prompt's ids come back too
    return tuple(c.model_extra["token_ids"]), c.text


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("prompt", PROMPTS)
def test_run_and_completions_give_the_same_tokens(client, prompt, case):
    params = params_of(case, prompt)
    args = tuple(cli_args(params))
    ids = kaon_run(prompt, args, True)
    served_ids, served_text = serve(client, prompt, params)
    assert ids == served_ids, (case, prompt)
    assert len(ids) >= 1
    # Not vacuous: the parameters change what greedy decoding gives.
    greedy = kaon_run(prompt, tuple(cli_args(CASES["greedy"])), True)
    if case == "stop":
        assert len(ids) < len(greedy) and ids == greedy[:len(ids)]
        assert not any(s in served_text for s in params["stop"])
    elif case != "greedy":
        assert ids != greedy, case
    # The text too, where stop strings cut it.
    if case == "stop":
        assert kaon_run(prompt, args, False) == served_text


def test_streamed_completion_gives_the_same_tokens(client):
    prompt = PROMPTS[1]
    params = CASES["seeded_penalties"]
    ids, text = serve(client, prompt, params, stream=True)
    assert ids == kaon_run(prompt, tuple(cli_args(params)), True)
    assert text == serve(client, prompt, params)[1]
