"""bench/gpu_throughput.py --time-limit: a run longer than the limit is stopped and still reports
what it generated (from kaon generate's progress line); a run within it reports as a whole run.
The engine alone (--device noop, dummy weights of a tiny Llama), so no GPU is needed."""
import json
import random

from conftest import BUILD
import gpu_throughput

TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float32"}


def generate_cmd(tmp_path, requests, max_tokens):
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(TINY))
    rng = random.Random(3)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"prompt_ids": [rng.randrange(3, 500) for _ in range(64)]}) + "\n"
                           for _ in range(requests)))
    return [str(BUILD / "kaon"), "generate", "--device", "noop", "--load-format", "dummy", "-m", str(cfg),
            "--input", str(inp), "--output", str(tmp_path / "out.jsonl"), "--max-tokens", str(max_tokens),
            "--ignore-eos", "--temp", "0", "--threads", "1", "--max-model-len", str(64 + max_tokens + 16)]


def test_stopped_run_reports_its_progress(tmp_path):
    # ~2,000 x 4,000 tokens: far more than 5 s of the engine alone on one thread (16 s here).
    done, part = gpu_throughput.run_limited(generate_cmd(tmp_path, 2000, 4000), 5)
    assert done is None and part["stopped_after_s"] == 5
    assert part["generated"] > 0 and part["output_tok_s"] > 0, part
    assert part["done"] < 2000, part


def test_run_within_the_limit_is_whole(tmp_path):
    done, part = gpu_throughput.run_limited(generate_cmd(tmp_path, 20, 8), 120)
    assert part is None and done.returncode == 0, done.stderr[-2000:]
    assert "generate: 20 requests, 1280 prompt + 160 generated tokens" in done.stderr
    assert "kaon-stats: " in done.stderr
