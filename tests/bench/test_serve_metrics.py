"""bench/serve.py's metrics against a fake streaming server with known delays (tests/bench/fake_server.py):
TTFT, TPOT, ITL and E2EL as vLLM defines them, failures counted (HTTP 500 and errors inside the
stream), goodput under SLOs, usage preferred over chunk counts, exact random prompt lengths,
sweeps writing results and plots, and `kaon bench serve` reaching the script."""
import json
import math
import random
import subprocess

import numpy as np
import pytest

from conftest import BUILD
from fake_server import FakeServer
import serve

TOL_MS = 15.0  # client and server share this machine: a few ms of scheduling noise


def run(server, tmp_path, *extra):
    args = ["--base-url", server.base, "--random-input-len", "12", "--random-output-len", "6",
            "--num-prompts", "6", "--max-concurrency", "2", "--result-dir", str(tmp_path),
            "--disable-tqdm", "--no-plot", *map(str, extra)]
    return serve.main(args)


@pytest.fixture
def fake():
    servers = []

    def make(plan=None, tokenizer=True, metrics=False):
        s = FakeServer(plan, tokenizer, metrics)
        servers.append(s)
        return s
    yield make
    for s in servers:
        s.close()


def test_percentile_is_numpys():
    rng = random.Random(1)
    for n in (1, 2, 7, 100):
        v = [rng.random() for _ in range(n)]
        for p in (0, 10, 50, 90, 99, 100):
            assert serve.percentile(v, p) == pytest.approx(float(np.percentile(v, p)), abs=1e-12)
    assert serve.percentile([], 99) == 0.0


def test_metric_definitions_on_known_outputs():
    O = serve.RequestOutput
    outs = [
        # ttft 0.1, 4 tokens, last chunk at 0.4: TPOT = (0.4 - 0.1) / 3 = 0.1
        O(success=True, ttft=0.1, latency=0.4, itl=[0.1, 0.1, 0.1], output_tokens=4, n_chunks=4, prompt_len=10, start_time=0.0),
        # 11 tokens by usage in 3 chunks: TPOT = (0.7 - 0.2) / 10 = 0.05 (usage wins over chunk count)
        O(success=True, ttft=0.2, latency=0.7, itl=[0.2, 0.3], output_tokens=11, n_chunks=3, prompt_len=20, start_time=0.05),
        # one token: no TPOT in the statistics, TPOT 0 for goodput
        O(success=True, ttft=0.3, latency=0.3, itl=[], output_tokens=1, n_chunks=1, prompt_len=5, start_time=0.1),
        O(success=False, error="HTTP 500: boom", start_time=0.2),
    ]
    r = serve.calculate_metrics(outs, duration=2.0, percentiles=[50, 90, 99], goodput={"ttft": 250, "tpot": 80})
    assert (r["completed"], r["failed"]) == (3, 1)
    assert r["total_input_tokens"] == 35 and r["total_output_tokens"] == 16
    assert r["request_throughput"] == pytest.approx(1.5)
    assert r["output_throughput"] == pytest.approx(8.0)
    assert r["total_token_throughput"] == pytest.approx(25.5)
    assert r["mean_ttft_ms"] == pytest.approx(200.0)
    assert r["median_ttft_ms"] == pytest.approx(200.0)
    assert r["p90_ttft_ms"] == pytest.approx(float(np.percentile([100, 200, 300], 90)))
    assert r["mean_tpot_ms"] == pytest.approx(75.0)            # (100 + 50) / 2
    assert r["mean_itl_ms"] == pytest.approx(160.0)            # (0.1 * 3 + 0.2 + 0.3) / 5
    assert r["median_itl_ms"] == pytest.approx(100.0)
    assert r["mean_e2el_ms"] == pytest.approx(1400.0 / 3)
    assert r["std_ttft_ms"] == pytest.approx(float(np.std([100, 200, 300])))
    # goodput: request 1 fails TPOT (100 > 80), request 2 passes, request 3 fails TTFT (300 > 250)
    assert r["good_requests"] == 1 and r["request_goodput"] == pytest.approx(0.5)
    assert r["max_concurrent_requests"] == 3
    assert r["first_errors"] == ["HTTP 500: boom"]
    assert r["tokens_per_s_per_user"] == pytest.approx(1000.0 / 75.0)


def test_stream_timings(fake, tmp_path):
    ttft, itl = 0.15, 0.04
    s = fake(lambda k, body: {"ttft": ttft, "itl": itl})
    r = run(s, tmp_path, "--prompt-format", "ids", "--random-vocab-size", "1000")
    assert (r["completed"], r["failed"]) == (6, 0)
    assert r["total_output_tokens"] == 36 and r["total_input_tokens"] == 72
    # What the server did, from its own clock (same process): arrival and each chunk's send time.
    tm = list(s.timings.values())
    ttfts = [t["chunks"][0] - t["recv"] for t in tm]
    itls = [b - a for t in tm for a, b in zip(t["chunks"], t["chunks"][1:])]
    tpots = [(t["chunks"][-1] - t["chunks"][0]) / 5 for t in tm]
    e2els = [t["chunks"][-1] - t["recv"] for t in tm]
    ms = lambda v: 1000 * float(np.mean(v))
    med = lambda v: 1000 * float(np.median(v))
    # TTFT and E2EL also hold the client-to-server hop (send, accept, parse) that the server's
    # clock does not see: never less than the server's view, and at most a loaded machine's
    # scheduling noise more (a wrong definition, e.g. up to the second chunk, is 40 ms off).
    for key, server in (("mean_ttft_ms", ms(ttfts)), ("median_ttft_ms", med(ttfts)), ("mean_e2el_ms", ms(e2els))):
        assert server - 1.0 <= r[key] <= server + TOL_MS, (key, r[key], server)
    assert r["mean_itl_ms"] == pytest.approx(ms(itls), abs=TOL_MS / 5)
    assert r["mean_tpot_ms"] == pytest.approx(ms(tpots), abs=TOL_MS / 5)
    # and the planned delays, within the machine's noise
    assert r["median_ttft_ms"] == pytest.approx(ttft * 1000, abs=TOL_MS)
    assert r["median_itl_ms"] == pytest.approx(itl * 1000, abs=TOL_MS)
    assert r["median_tpot_ms"] == pytest.approx(itl * 1000, abs=TOL_MS / 3)
    assert r["median_e2el_ms"] == pytest.approx((ttft + 5 * itl) * 1000, abs=TOL_MS)
    # two in flight at most, each taking ttft + 5 itl: three waves
    assert r["max_concurrent_requests"] == 2
    assert r["duration"] == pytest.approx(3 * (ttft + 5 * itl), abs=0.1)
    assert r["request_throughput"] == pytest.approx(6 / r["duration"])
    # the results file: vLLM's keys plus date, commit, machine, model, command
    saved = json.loads(next(tmp_path.glob("serve-fake-*.json")).read_text())
    for k in ("date", "commit", "machine", "model", "command", "label", "runs", "request_throughput",
              "output_throughput", "total_token_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
              "mean_tpot_ms", "p90_itl_ms", "median_e2el_ms", "completed", "failed"):
        assert k in saved, k
    assert saved["model"] == "fake-model" and saved["label"] == "fake"
    # every request streamed with usage, ignore_eos (random dataset default) and its output length
    for body in s.requests:
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["ignore_eos"] is True and body["max_tokens"] == 6 and len(body["prompt"]) == 12


def test_server_steps_from_kaon_metrics(fake, tmp_path):
    """A kaon server's step counters over the level (after - before; replicas' samples skipped);
    a server without them (vLLM, llama.cpp) leaves the key out."""
    r = run(fake(metrics=True), tmp_path, "--prompt-format", "ids", "--random-vocab-size", "1000")
    assert r["completed"] == 6
    assert r["server_steps"] == {"prefill_steps": 6, "decode_steps": 12, "prefill_step_s": 1.5,
                                 "decode_step_s": 0.75, "preemptions": 2}
    r = run(fake(), tmp_path, "--prompt-format", "ids", "--random-vocab-size", "1000")
    assert r["completed"] == 6 and "server_steps" not in r


def test_failures_are_counted_and_goodput(fake, tmp_path):
    def plan(k, body):
        p = {"ttft": 0.03 if k % 2 == 0 else 0.2, "itl": 0.01}
        if k % 5 == 3:
            p["status"] = 500
        if k % 5 == 4:
            p["error_after"] = 2
        return p
    s = fake(plan)
    r = run(s, tmp_path, "--num-prompts", "10", "--max-concurrency", "1", "--prompt-format", "ids",
            "--random-vocab-size", "50", "--goodput", "ttft:100", "tpot:50")
    # k = 0..9 in order (one in flight): 3 and 8 get HTTP 500, 4 and 9 an error mid-stream
    assert (r["completed"], r["failed"]) == (6, 4)
    assert r["good_requests"] == 3  # the completed ones with even k: 0, 2, 6
    assert r["request_goodput"] * r["duration"] == pytest.approx(3)
    assert any(e.startswith("HTTP 500") for e in r["first_errors"])
    assert any("error in stream: planned stream error" in e for e in r["first_errors"])
    assert r["total_output_tokens"] == 36  # failed requests add no tokens
    assert r["median_ttft_ms"] == pytest.approx((30 + 200) / 2, abs=TOL_MS)  # three of 30 ms, three of 200 ms


def test_connection_errors_are_failures(tmp_path):
    s = FakeServer()
    base = s.base
    # /v1/models answers, then the server goes away before the run: every request fails, none is hidden
    outs = [serve.RequestOutput(success=False, error="ClientConnectorError: refused")] * 3
    r = serve.calculate_metrics(outs, 1.0)
    assert (r["completed"], r["failed"]) == (0, 3) and r["output_throughput"] == 0
    s.close()
    with pytest.raises(SystemExit):
        serve.main(["--base-url", base, "--num-prompts", "2", "--no-save", "--disable-tqdm"])


def test_usage_is_preferred_and_chunks_are_the_fallback(fake, tmp_path):
    s = fake(lambda k, body: {"ttft": 0.02, "itl": 0.03, "chunks": 6, "usage_tokens": 11})
    r = run(s, tmp_path, "--prompt-format", "ids", "--random-vocab-size", "100")
    assert r["total_output_tokens"] == 66
    assert r["mean_tpot_ms"] == pytest.approx(5 * 30 / 10, abs=TOL_MS / 3)
    assert r["mean_itl_ms"] == pytest.approx(30, abs=TOL_MS / 3)
    assert r["output_tokens_counted_from_chunks"] == 0
    s2 = fake(lambda k, body: {"ttft": 0.02, "itl": 0.02, "usage_tokens": None})
    r = run(s2, tmp_path, "--prompt-format", "ids", "--random-vocab-size", "100")
    assert r["total_output_tokens"] == 36 and r["output_tokens_counted_from_chunks"] == 6


def test_text_prompts_have_exact_lengths_and_shared_prefix(fake, tmp_path):
    s = fake()
    r = run(s, tmp_path, "--random-input-len", "20", "--random-range-ratio", "0.5", "--random-prefix-len", "8",
            "--num-prompts", "12", "--max-concurrency", "4", "--seed", "3")
    assert r["prompt_format"] == "text"
    lens = [len(s.tokenize(b["prompt"])) for b in s.requests]
    assert all(8 + 10 <= n <= 8 + 30 for n in lens), lens
    assert len(set(lens)) > 1
    assert r["total_input_tokens"] == sum(lens)
    prefixes = {tuple(b["prompt"].split()[:8]) for b in s.requests}
    assert len(prefixes) == 1
    assert len({b["prompt"] for b in s.requests}) == 12


def test_words_when_the_server_has_no_tokenizer(fake, tmp_path):
    s = fake(tokenizer=False)
    r = run(s, tmp_path, "--random-input-len", "30")
    assert r["prompt_format"] == "words" and r["completed"] == 6
    bench = [b for b in s.requests if b.get("stream")]
    assert all(abs(len(b["prompt"].split()) - 30) <= 1 for b in bench)


def test_chat_endpoint(fake, tmp_path):
    s = fake(lambda k, body: {"ttft": 0.05, "itl": 0.02})
    r = run(s, tmp_path, "--endpoint", "/v1/chat/completions")
    assert r["completed"] == 6 and r["total_output_tokens"] == 36
    assert r["mean_ttft_ms"] == pytest.approx(50, abs=TOL_MS)
    assert all(b["max_completion_tokens"] == 6 and b["messages"][0]["role"] == "user" for b in s.requests)


def test_request_rate_arrivals():
    rng = random.Random(0)
    d = serve.arrival_delays(200, 50.0, 1.0, rng)
    assert d == sorted(d) and d[-1] == pytest.approx(200 / 50.0)
    gaps = np.diff([0.0] + d)
    assert 0.7 < np.std(gaps) / np.mean(gaps) < 1.3       # exponential gaps: CV ~ 1
    d = serve.arrival_delays(200, 50.0, 20.0, random.Random(0))
    gaps = np.diff([0.0] + d)
    assert np.std(gaps) / np.mean(gaps) < 0.4             # burstiness > 1: more regular
    assert serve.arrival_delays(3, math.inf, 1.0, rng) == [0.0, 0.0, 0.0]
    assert serve.parse_goodput(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    with pytest.raises(ValueError):
        serve.parse_goodput(["latency:3"])


def test_request_rate_run(fake, tmp_path):
    s = fake(lambda k, body: {"ttft": 0.01, "itl": 0.0})
    r = run(s, tmp_path, "--request-rate", "20", "--num-prompts", "10", "--max-concurrency", "0",
            "--prompt-format", "ids", "--random-vocab-size", "10")
    assert r["completed"] == 10 and r["request_rate"] == 20.0
    assert r["duration"] == pytest.approx(0.5, abs=0.15)  # the last request leaves at 10 / 20 s


def test_sweep_writes_runs_and_plots(fake, tmp_path):
    s = fake(lambda k, body: {"ttft": 0.02, "itl": 0.005})
    res = serve.main(["--base-url", s.base, "--random-input-len", "8", "--random-output-len", "4",
                      "--num-prompts", "4", "--max-concurrency", "1,2,4", "--result-dir", str(tmp_path),
                      "--disable-tqdm", "--prompt-format", "ids", "--random-vocab-size", "10", "--label", "A"])
    assert [r["max_concurrency"] for r in res["runs"]] == [1, 2, 4]
    files = sorted(p.name for p in tmp_path.iterdir())
    stem = next(f for f in files if f.endswith(".json"))[:-5]
    for kind in ("throughput", "ttft", "tpot", "interactivity", "summary"):
        assert f"{stem}.{kind}.png" in files
    # two result files in one plot
    import plot
    res_b = dict(res, label="B")
    out = plot.plot_results([res, res_b], tmp_path / "combined", "ab-")
    assert len(out) == 5 and all(p.stat().st_size > 5000 for p in out)


def test_kaon_bench_serve_runs_the_script(fake, tmp_path):
    exe = BUILD / "kaon"
    if not exe.exists():
        pytest.fail(f"kaon binary not found at {exe}: build it or set KAON_BUILD")
    out = subprocess.run([str(exe), "bench", "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "--max-concurrency" in out.stdout and "kaon bench serve" in out.stdout
    s = fake(lambda k, body: {"ttft": 0.01})
    out = subprocess.run([str(exe), "bench", "serve", "--base-url", s.base, "--num-prompts", "3", "--random-input-len", "4",
                          "--random-output-len", "3", "--result-dir", str(tmp_path), "--disable-tqdm"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Successful requests:                     3" in out.stdout
    saved = json.loads(next(tmp_path.glob("serve-*.json")).read_text())
    assert saved["command"].startswith("kaon bench serve --base-url")
