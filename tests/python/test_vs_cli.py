"""LLM.generate and LLM.chat give exactly what the command line gives: greedy ids equal
`kaon run --print-ids` (one prompt) and `kaon generate` (a batch), chat text equals `kaon chat`."""
import json
import subprocess

from conftest import KAON, MODEL
from kaon import SamplingParams

PROMPTS = ["The capital of France is", "Once upon a time", "def fibonacci(n):",
           "List three colors:", "1, 2, 3, 4,", "The quick brown fox", "Water boils at", "Hello, my name is"]


def test_greedy_ids_equal_kaon_run(llm):
    got = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=24))
    cli = subprocess.run([KAON, "run", "-m", MODEL, "-p", PROMPTS[0], "--temp", "0", "-n", "24", "--print-ids"],
                         capture_output=True, text=True, check=True)
    ids = json.loads(cli.stdout.strip().splitlines()[-1])
    assert len(got) == 1 and got[0].outputs[0].token_ids == ids
    assert got[0].prompt == PROMPTS[0] and got[0].finished


def test_batched_greedy_equals_kaon_generate(llm, tmp_path):
    inp, outp = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    subprocess.run([KAON, "generate", "-m", MODEL, "--input", str(inp), "--output", str(outp), "--temp", "0",
                    "--max-tokens", "20", "--max-model-len", "1024", "--quiet"], capture_output=True, check=True)
    cli = [json.loads(line) for line in outp.read_text().splitlines()]
    got = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=20))
    assert [o.outputs[0].token_ids for o in got] == [c["token_ids"] for c in cli]
    assert [o.outputs[0].text for o in got] == [c["text"] for c in cli]
    assert [o.outputs[0].finish_reason for o in got] == [c["finish_reason"] for c in cli]
    # One by one gives the same as the batch.
    single = [llm.generate(p, SamplingParams(temperature=0, max_tokens=20))[0] for p in PROMPTS[:3]]
    assert [o.outputs[0].token_ids for o in single] == [o.outputs[0].token_ids for o in got[:3]]


def test_chat_equals_kaon_chat(llm):
    msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "What is 2+2?"}]
    got = llm.chat(msgs, SamplingParams(temperature=0, max_tokens=20))[0]
    cli = subprocess.run([KAON, "chat", "-m", MODEL, "--system", msgs[0]["content"], "--temp", "0", "-n", "20"],
                         input="What is 2+2?\n/exit\n", capture_output=True, text=True, check=True)
    # stdout: "> " + the streamed answer + "> " (the turn's newline and stats go to stderr).
    assert cli.stdout.startswith("> ") and cli.stdout.endswith("> ")
    answer = cli.stdout[2:-2]
    assert got.outputs[0].text == answer
    assert got.prompt == ("<|im_start|>system\nYou are brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                          "<|im_start|>assistant\n")
    tok = llm.get_tokenizer()
    assert got.prompt_token_ids == tok.apply_chat_template(msgs, tokenize=True)


def test_dummy_model_ids_equal_kaon_generate(tmp_path):
    """dummy:CONFIG (random weights of a config, no tokenizer: what the GPU machine benchmarks)
    takes token-id prompts and gives `kaon generate --load-format dummy`'s greedy ids."""
    from kaon import LLM
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 128, "intermediate_size": 256,
                               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                               "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
                               "rope_theta": 10000.0, "bos_token_id": 1, "eos_token_id": 2}))
    prompts = [[5, 17, 42, 9], [300, 301, 302, 303, 304, 7]]
    inp, outp = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text("".join(json.dumps({"prompt_ids": p}) + "\n" for p in prompts))
    subprocess.run([KAON, "generate", "-m", str(cfg), "--load-format", "dummy", "--input", str(inp), "--output",
                    str(outp), "--temp", "0", "--max-tokens", "10", "--ignore-eos", "--quiet"],
                   capture_output=True, check=True)
    want = [json.loads(line)["token_ids"] for line in outp.read_text().splitlines()]
    llm = LLM(f"dummy:{cfg}", max_model_len=256, kv_cache_memory_bytes=16 << 20)
    try:
        got = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))
    finally:
        llm.close()
    assert [o.outputs[0].token_ids for o in got] == want and all(len(w) == 10 for w in want)
    assert len(set(map(tuple, want))) == 2  # the two prompts continue differently: real math ran
