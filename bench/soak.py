#!/usr/bin/env python3
"""Soak test for `kaon serve` (issue 9): a long run at high concurrency, then checks that the
server neither failed nor grew.

    python3 bench/soak.py                                   # 30 min, 200 clients, starts kaon serve
    python3 bench/soak.py --minutes 2 --clients 50          # a short run
    python3 bench/soak.py --url http://127.0.0.1:8000 --pid 1234

By default it starts `$KAON_BUILD/kaon serve` (KAON_BUILD defaults to build/) on the default
model with --threads 2. Each of --clients asyncio clients loops over a random mix of
  streams (completions and chat) read to [DONE]; non-streaming requests (some with n = 2);
  streams the client aborts after a few events; clients that disconnect before or right after
  sending the request (some mid-body); /tokenize and /metrics calls,
with random sampling parameters (temperature, top_p, top_k, min_p, penalties, seeds, stop
strings, logprobs) and prompts that share one of a few long prefixes (prefix cache hits,
evictions, preemption). VmRSS of the server is sampled from /proc every --rss-every seconds.

Pass criteria (exit status 1 when one fails):
  - no 5xx and no broken response for a valid request, the server never dies, exit 0 on SIGTERM;
  - at the end (idle): kaon:num_requests_running == waiting == 0, kaon:kv_cache_usage_perc == 0;
  - RSS flat: the idle RSS after the load is within --rss-tolerance of the idle RSS after the
    warm-up (both after the same probes), and the steady-state slope is reported;
  - the seeded probe requests give identical outputs before and after the load.
Writes the RSS curve (matplotlib) to --png and the figures to --json.
"""
import argparse
import asyncio
import json
import os
import pathlib
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[1]

PREFIXES = [
    "You are a meticulous travel agent. Plan trips with realistic budgets, mention local food, "
    "transport options and one hidden gem per city. Keep every answer under five sentences. " * 2,
    "System: you answer questions about chemistry for high-school students. Explain each idea "
    "with one everyday example and avoid formulas unless asked. " * 3,
    "The following is a conversation between a curious child and a patient grandparent who "
    "knows a lot about birds, trees and the weather. " * 3,
    "Summarize the text below in one sentence, then list three keywords.\n\nText: The old "
    "lighthouse at the end of the harbour was repainted last spring by volunteers. " * 2,
    "Act as a Linux terminal. Reply only with the output of each command, inside one code "
    "block, and nothing else. " * 3,
]
QUESTIONS = ["What should I see first?", "Why?", "Tell me more.", "Give an example.",
             "What is the weather like?", "Explain it simply.", "ls -la /tmp", "Continue.",
             "Name three birds.", "How do magnets work?", "What is a mole?", "Write a haiku."]
STOPS = [["\n\n"], ["."], ["User:", "###"], ["the"]]

# Seeded probes: run alone before and after the load; their outputs must not change.
PROBES = [
    ("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0}),
    ("/v1/completions", {"prompt": PREFIXES[0] + "Rome:", "max_tokens": 24, "temperature": 0.8,
                         "seed": 42, "top_p": 0.9}),
    ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 20, "temperature": 1.0,
                         "seed": 7, "n": 2, "logprobs": 2}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a primary color."}],
                              "max_tokens": 16, "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": PREFIXES[2]},
                                           {"role": "user", "content": "What is a robin?"}],
                              "max_tokens": 24, "temperature": 0.7, "seed": 3, "top_k": 40,
                              "frequency_penalty": 0.5}),
]


# ---- a small HTTP/1.1 client over asyncio streams -------------------------------------------

class BadResponse(Exception):
    pass


async def read_head(reader):
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise BadResponse(f"bad status line {lines[0]!r}")
    headers = {}
    for ln in lines[1:]:
        if ":" in ln:
            k, v = ln.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


async def body_chunks(reader, headers):
    """Yields the body's pieces (chunked or Content-Length)."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            line = await reader.readuntil(b"\r\n")
            n = int(line.split(b";")[0].strip(), 16)
            if n == 0:
                await reader.readuntil(b"\r\n")
                return
            data = await reader.readexactly(n + 2)
            yield data[:-2]
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if n:
            yield await reader.readexactly(n)
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


def request_bytes(host, path, body, method="POST"):
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    return head.encode() + b"\r\n" + data


async def call(host, port, path, body=None, method="POST", abort_after=None, timeout=600):
    """One request on its own connection. Returns (status, body bytes, sse events, aborted)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
    try:
        writer.write(request_bytes(host, path, body, method))
        await writer.drain()
        status, headers = await asyncio.wait_for(read_head(reader), timeout)
        stream = headers.get("content-type", "").startswith("text/event-stream")
        buf, events = b"", []
        agen = body_chunks(reader, headers)
        while True:
            try:
                piece = await asyncio.wait_for(agen.__anext__(), timeout)
            except StopAsyncIteration:
                break
            buf += piece
            if stream:
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    events.append(ev.decode())
                if abort_after is not None and len(events) >= abort_after:
                    return status, b"", events, True
        return status, buf, events, False
    finally:
        writer.close()


# ---- the load ---------------------------------------------------------------------------------

class Stats:
    def __init__(self):
        self.ops = {}
        self.errors = []          # server errors: 5xx, broken responses, refused connections
        self.client_errors = []   # 4xx for requests that should have been valid
        self.completed = 0
        self.tokens = 0

    def count(self, op):
        self.ops[op] = self.ops.get(op, 0) + 1


def random_sampling(rng):
    sp = {"temperature": rng.choice([0, 0.3, 0.7, 1.0, 1.3]), "max_tokens": rng.randint(1, 64)}
    if rng.random() < 0.5:
        sp["seed"] = rng.randint(0, 10 ** 6)
    if rng.random() < 0.3:
        sp["top_p"] = rng.choice([0.5, 0.9, 0.95])
    if rng.random() < 0.3:
        sp["top_k"] = rng.choice([1, 5, 40, 200])
    if rng.random() < 0.2:
        sp["min_p"] = rng.choice([0.02, 0.1])
    if rng.random() < 0.2:
        sp["presence_penalty"] = rng.uniform(-1, 1)
    if rng.random() < 0.2:
        sp["frequency_penalty"] = rng.uniform(-1, 1)
    if rng.random() < 0.15:
        sp["repetition_penalty"] = rng.uniform(0.9, 1.3)
    if rng.random() < 0.2:
        sp["stop"] = rng.choice(STOPS)
    if rng.random() < 0.15:
        sp["ignore_eos"] = True
    return sp


def make_request(rng):
    chat = rng.random() < 0.5
    sp = random_sampling(rng)
    prefix = rng.choice(PREFIXES)
    q = rng.choice(QUESTIONS)
    if chat:
        body = {"messages": [{"role": "system", "content": prefix}, {"role": "user", "content": q}], **sp}
        if rng.random() < 0.15:
            body["logprobs"] = True
            body["top_logprobs"] = rng.randint(0, 3)
        return "/v1/chat/completions", body
    body = {"prompt": prefix + q, **sp}
    if rng.random() < 0.15:
        body["logprobs"] = rng.randint(0, 3)
    return "/v1/completions", body


def check_events(events, stats, what):
    """A stream must end with [DONE] and every choice must have finished (stop or length)."""
    if not events or events[-1] != "data: [DONE]":
        stats.errors.append(f"{what}: stream did not end with [DONE] ({events[-1:]})")
        return
    for ev in events[:-1]:
        d = json.loads(ev[6:])
        if "error" in d:
            stats.errors.append(f"{what}: error event {d['error']}")
            return
        for c in d.get("choices", []):
            if c.get("finish_reason") not in (None, "stop", "length"):
                stats.errors.append(f"{what}: finish_reason {c.get('finish_reason')}")
        if d.get("usage"):
            stats.tokens += d["usage"].get("completion_tokens", 0)


async def client_loop(k, host, port, t_end, stats, seed):
    rng = random.Random(seed * 100003 + k)
    while time.time() < t_end:
        op = rng.choices(["stream", "nonstream", "abort", "disconnect", "misc"],
                         weights=[45, 22, 15, 10, 8])[0]
        stats.count(op)
        path, body = make_request(rng)
        try:
            if op == "stream":
                body["stream"] = True
                body["stream_options"] = {"include_usage": True}
                if rng.random() < 0.2 and "messages" not in body:
                    body["n"] = 2
                status, data, events, _ = await call(host, port, path, body)
                if status != 200:
                    (stats.errors if status >= 500 else stats.client_errors).append(f"stream {status} {data[:200]}")
                else:
                    check_events(events, stats, "stream")
                    stats.completed += 1
            elif op == "nonstream":
                if rng.random() < 0.2:
                    body["n"] = 2
                status, data, _, _ = await call(host, port, path, body)
                if status != 200:
                    (stats.errors if status >= 500 else stats.client_errors).append(f"nonstream {status} {data[:200]}")
                else:
                    d = json.loads(data)
                    for c in d["choices"]:
                        if c["finish_reason"] not in ("stop", "length"):
                            stats.errors.append(f"nonstream finish_reason {c['finish_reason']}")
                    stats.tokens += d["usage"]["completion_tokens"]
                    stats.completed += 1
            elif op == "abort":
                body["stream"] = True
                body["max_tokens"] = 256
                body["ignore_eos"] = True
                status, data, events, aborted = await call(host, port, path, body,
                                                           abort_after=rng.randint(1, 12))
                if status >= 500:
                    stats.errors.append(f"abort {status}")
            elif op == "disconnect":
                reader, writer = await asyncio.open_connection(host, port)
                raw = request_bytes(host, path, body)
                how = rng.random()
                if how < 0.3:
                    writer.write(raw[: rng.randint(1, len(raw) - 1)])  # mid-request
                else:
                    writer.write(raw)
                await writer.drain()
                await asyncio.sleep(rng.random() * 0.5)
                writer.close()
            else:
                if rng.random() < 0.5:
                    status, data, _, _ = await call(host, port, "/tokenize",
                                                    {"prompt": rng.choice(PREFIXES) + rng.choice(QUESTIONS)})
                else:
                    status, data, _, _ = await call(host, port, "/metrics", None, method="GET")
                if status != 200:
                    (stats.errors if status >= 500 else stats.client_errors).append(f"misc {status}")
        except (ConnectionRefusedError, ConnectionResetError, asyncio.IncompleteReadError, BadResponse,
                asyncio.TimeoutError, OSError) as e:
            if op not in ("disconnect", "abort"):
                stats.errors.append(f"{op}: {type(e).__name__}: {e}")


async def run_load(host, port, clients, seconds, seed):
    stats = Stats()
    t_end = time.time() + seconds
    await asyncio.gather(*(client_loop(k, host, port, t_end, stats, seed) for k in range(clients)))
    return stats


# ---- server, probes, metrics, RSS ---------------------------------------------------------------

def http(host, port, method, path, body=None, timeout=300):
    async def go():
        status, data, events, _ = await call(host, port, path, body, method=method, timeout=timeout)
        return status, data
    return asyncio.run(go())


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def run_probes(host, port):
    outs = []
    for path, body in PROBES:
        status, data = http(host, port, "POST", path, body)
        if status != 200:
            raise SystemExit(f"probe {path} failed: {status} {data[:300]}")
        d = json.loads(data)
        outs.append([c.get("text") if "text" in c else c["message"]["content"] for c in d["choices"]])
    return outs


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


class RssSampler(threading.Thread):
    def __init__(self, pid, every):
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.samples = []  # (t, MiB)
        self.stop = threading.Event()
        self.t0 = time.time()

    def sample(self):
        v = rss_kib(self.pid)
        if v is not None:
            self.samples.append((time.time() - self.t0, v / 1024))
        return v

    def run(self):
        while not self.stop.is_set():
            try:
                self.sample()
            except FileNotFoundError:
                return
            self.stop.wait(self.every)


def count_5xx(metrics_text):
    """HTTP 5xx responses so far, from /metrics."""
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in metrics_text.splitlines()
               if ln.startswith("kaon:http_requests_total") and 'code="5' in ln)


def wait_idle(host, port, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        status, data = http(host, port, "GET", "/metrics")
        m = data.decode()
        if (status == 200 and metric(m, "kaon:num_requests_running") == 0
                and metric(m, "kaon:num_requests_waiting") == 0
                and metric(m, "kaon:kv_cache_usage_perc") == 0):
            return m
        time.sleep(0.5)
    return None


def start_server(args):
    exe = pathlib.Path(os.environ.get("KAON_BUILD", REPO / "build")) / "kaon"
    tmp = tempfile.mkdtemp(prefix="kaon-soak-")
    port_file = pathlib.Path(tmp) / "port"
    log = open(pathlib.Path(tmp) / "server.log", "wb")
    cmd = [str(exe), "serve", "--port", "0", "--port-file", str(port_file), "--threads", str(args.threads)]
    cmd += args.server_args.split() if args.server_args else []
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"kaon serve did not start; see {log.name}")
        time.sleep(0.05)
    host, port = port_file.read_text().split()
    while True:
        try:
            if http(host, int(port), "GET", "/health")[0] == 200:
                break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"kaon serve did not become healthy; see {log.name}")
        time.sleep(0.1)
    return proc, host, int(port), log.name, " ".join(cmd)


def plot(samples, marks, png, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    ax.plot([t / 60 for t, _ in samples], [v for _, v in samples], lw=1.4, color="#1f6feb")
    for t, label in marks:
        ax.axvline(t / 60, color="#888", ls="--", lw=0.8)
        ax.text(t / 60, ax.get_ylim()[1], " " + label, va="top", fontsize=8, color="#555")
    ax.set_xlabel("minutes since the server was ready")
    ax.set_ylabel("VmRSS (MiB)")
    ax.set_title(title, fontsize=10)
    lo = min(v for _, v in samples)
    ax.set_ylim(bottom=0, top=max(v for _, v in samples) * 1.15 if lo > 0 else None)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png)


def slope_mib_per_hour(samples):
    if len(samples) < 3:
        return 0.0
    ts = [t for t, _ in samples]
    vs = [v for _, v in samples]
    mt, mv = statistics.fmean(ts), statistics.fmean(vs)
    den = sum((t - mt) ** 2 for t in ts)
    return sum((t - mt) * (v - mv) for t, v in zip(ts, vs)) / den * 3600 if den else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2, help="kaon serve --threads")
    ap.add_argument("--server-args", default="", help="more kaon serve arguments")
    ap.add_argument("--url", help="an already running server (then --pid for RSS)")
    ap.add_argument("--pid", type=int)
    ap.add_argument("--warmup", type=float, default=0.15, help="fraction of the run before the steady state")
    ap.add_argument("--rss-every", type=float, default=5)
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--png", default=str(REPO / "docs/perf/soak_rss.png"))
    ap.add_argument("--json", default=str(REPO / "docs/perf/soak.json"))
    args = ap.parse_args()
    resource_limit()

    proc = None
    if args.url:
        host, port = args.url.split("//")[1].rstrip("/").split(":")
        port, pid, cmd, log = int(port), args.pid, "(external)", None
    else:
        proc, host, port, log, cmd = start_server(args)
        pid = proc.pid
    print(f"soak: server {cmd} at {host}:{port} (pid {pid}); {args.clients} clients for {args.minutes} min")
    sampler = RssSampler(pid, args.rss_every) if pid else None
    if sampler:
        sampler.start()
    marks = []
    # Warm up (so the prefix cache, arenas and the allocator settle), then the reference probes.
    asyncio.run(run_load(host, port, min(args.clients, 32), 10, args.seed + 999))
    # (the 503s to our /health polls while the model loaded do not count)
    fives_before = count_5xx(wait_idle(host, port) or "")
    probes_before = run_probes(host, port)
    time.sleep(3)
    rss_idle_before = rss_kib(pid) / 1024 if pid else None
    t_load = sampler.samples[-1][0] if sampler and sampler.samples else 0
    marks.append((t_load, "load starts"))
    t0 = time.time()
    stats = asyncio.run(run_load(host, port, args.clients, args.minutes * 60, args.seed))
    load_s = time.time() - t0
    marks.append((t_load + load_s, "load ends"))
    alive = proc is None or proc.poll() is None
    final_metrics = wait_idle(host, port) if alive else None
    probes_after = run_probes(host, port) if alive else None
    time.sleep(3)
    rss_idle_after = rss_kib(pid) / 1024 if pid and alive else None
    time.sleep(args.rss_every)
    if sampler:
        sampler.stop.set()
        sampler.join()

    exit_code = None
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        try:
            exit_code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            exit_code = "timeout"

    steady = [(t, v) for t, v in (sampler.samples if sampler else [])
              if t_load + args.warmup * load_s <= t <= t_load + load_s]
    rss_load = [v for _, v in steady]
    res = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv), "server": cmd, "clients": args.clients,
        "minutes": args.minutes, "load_seconds": round(load_s, 1),
        "ops": stats.ops, "completed": stats.completed, "completion_tokens": stats.tokens,
        "server_errors": len(stats.errors), "server_error_samples": stats.errors[:20],
        "client_errors": len(stats.client_errors), "client_error_samples": stats.client_errors[:20],
        "server_alive": alive, "exit_code": exit_code,
        "kv_usage_end": metric(final_metrics, "kaon:kv_cache_usage_perc") if final_metrics else None,
        "running_end": metric(final_metrics, "kaon:num_requests_running") if final_metrics else None,
        "waiting_end": metric(final_metrics, "kaon:num_requests_waiting") if final_metrics else None,
        "rss_idle_before_mib": rss_idle_before, "rss_idle_after_mib": rss_idle_after,
        "rss_load_min_mib": min(rss_load) if rss_load else None,
        "rss_load_max_mib": max(rss_load) if rss_load else None,
        "rss_load_slope_mib_per_hour": round(slope_mib_per_hour(steady), 2),
        "probes_identical": probes_before == probes_after,
        "probes": probes_before,
    }
    if final_metrics:
        res["http_5xx_during_load"] = count_5xx(final_metrics) - fives_before
    fails = []
    if res["server_errors"] or res["client_errors"]:
        fails.append("errors")
    if not alive or (proc is not None and exit_code != 0):
        fails.append("server died or did not exit 0")
    if res.get("http_5xx_during_load"):
        fails.append("5xx in /metrics")
    if not final_metrics:
        fails.append("not idle at the end (requests or KV blocks left)")
    if rss_idle_before and rss_idle_after and rss_idle_after > rss_idle_before * (1 + args.rss_tolerance):
        fails.append(f"RSS grew {rss_idle_before:.0f} -> {rss_idle_after:.0f} MiB")
    if not res["probes_identical"]:
        fails.append("probe outputs changed")
    res["pass"] = not fails
    res["failures"] = fails
    if sampler and sampler.samples:
        res["rss_samples"] = [(round(t, 1), round(v, 1)) for t, v in sampler.samples]
        plot(sampler.samples, marks, pathlib.Path(args.png),
             f"kaon serve soak: {args.clients} clients, {args.minutes:g} min, "
             f"{stats.completed} completed, {res['server_errors']} server errors")
    pathlib.Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    show = {k: v for k, v in res.items() if k not in ("rss_samples", "probes")}
    print(json.dumps(show, indent=1))
    print("soak:", "PASS" if res["pass"] else "FAIL " + "; ".join(fails))
    if log and not res["pass"]:
        print(f"server log: {log}")
    return 0 if res["pass"] else 1


def resource_limit():
    """200 clients, each with a socket or two: raise the soft fd limit."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 8192:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 65536), hard))


if __name__ == "__main__":
    sys.exit(main())
