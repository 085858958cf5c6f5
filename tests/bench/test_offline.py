"""`kaon bench throughput` and `kaon bench latency` on the default model (engine API, no HTTP): the
figures and JSON they write, and their errors."""
import json
import subprocess

import pytest

from conftest import BUILD, MODEL


def kaon(*args, timeout=300):
    exe = BUILD / "kaon"
    if not exe.exists():
        pytest.fail(f"kaon binary not found at {exe}: build it or set KAON_BUILD")
    if not MODEL.exists():
        pytest.fail(f"default model missing at {MODEL}: run scripts/setup.sh")
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def test_bench_throughput(tmp_path):
    out = tmp_path / "tp.json"
    r = kaon("bench", "throughput", "--num-prompts", 6, "--input-len", 16, "--output-len", 8,
             "--random-range-ratio", 0.5, "--threads", 2, "--kv-cache-memory", 32, "--max-model-len", 256,
             "--output-json", out)
    assert r.returncode == 0, r.stderr
    assert "Throughput:" in r.stdout and "requests/s" in r.stdout
    assert "6/6 requests" in r.stderr  # the progress bar's last state
    j = json.loads(out.read_text())
    for k in ("date", "commit", "machine", "model", "command", "elapsed_time", "num_requests", "total_num_tokens",
              "requests_per_second", "tokens_per_second", "output_tokens_per_second", "failed"):
        assert k in j, k
    assert j["benchmark"] == "throughput" and j["num_requests"] == 6 and j["failed"] == 0
    assert 6 * 4 <= j["total_output_tokens"] <= 6 * 12  # ignore EOS: every request runs to its length
    assert j["command"].startswith("kaon bench throughput --num-prompts 6")
    assert j["requests_per_second"] == pytest.approx(6 / j["elapsed_time"])


def test_bench_latency(tmp_path):
    out = tmp_path / "lat.json"
    r = kaon("bench", "latency", "--batch-sizes", "1,3", "--input-len", 8, "--output-len", 6, "--num-iters", 2,
             "--num-iters-warmup", 0, "--threads", 2, "--kv-cache-memory", 32, "--max-model-len", 256,
             "--output-json", out)
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    assert j["benchmark"] == "latency" and [x["batch_size"] for x in j["results"]] == [1, 3]
    for x in j["results"]:
        assert len(x["latencies"]) == 2 and x["avg_latency"] > 0 and x["failed"] == 0
        assert x["avg_latency"] == pytest.approx(sum(x["latencies"]) / 2)
        assert set(x["percentiles"]) == {"10", "25", "50", "75", "90", "99"}
        assert 0 < x["avg_prefill_s"] < x["avg_latency"]
        assert x["avg_decode_step_ms"] > 0
    lines = [ln for ln in r.stdout.splitlines() if ln.strip() and ln.split()[0].isdigit()]
    assert len(lines) == 2  # one table row per batch size


def test_bench_errors():
    r = kaon("bench", "latency", "--load-format", "dummy")
    assert r.returncode == 2 and "needs -m CONFIG" in r.stderr
    r = kaon("bench", "nope")
    assert r.returncode == 2 and "unknown bench command" in r.stderr
    r = kaon("bench", "throughput", "--batch-sizes", "1")
    assert r.returncode == 2 and "bad option" in r.stderr
    r = kaon("bench", "latency", "--help")
    assert r.returncode == 0 and "--batch-sizes" in r.stdout
