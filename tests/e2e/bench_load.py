#!/usr/bin/env python3
"""Load benchmark for an OpenAI-compatible server (not a pytest file: run it by hand).

    python3 tests/e2e/bench_load.py --clients 1000 --max-tokens 16         # starts kaon serve
    python3 tests/e2e/bench_load.py --url http://127.0.0.1:8080 --clients 1,8,32 --requests 64

With no --url it starts `$KAON_BUILD/kaon serve` on the default model, warms it up, records its
RSS, then runs the load while a separate process probes /health every 50 ms (a process, so the
load's event loop cannot delay the probe); afterwards it waits for the engine to go idle and
checks KV usage is back to 0 and RSS is within 10% of before.

Ten thousand connections (issue 23): every client connects at once and streams one chat
completion of 8 tokens; all must succeed and /health's p99 stay under 50 ms:

    python3 tests/e2e/bench_load.py --clients 10000 --max-tokens 8 --chat --ignore-eos

Clients are asyncio streams speaking HTTP/1.1 directly (chunked SSE), so one Python process can
hold 1,000 concurrent streams. Each client sends one streaming /v1/completions (or chat with
--chat) request per turn; TTFT is the time to the first non-empty text delta, and throughput is
output tokens (from the final usage chunk) over the wall time of the run.
"""
import argparse
import asyncio
import collections
import json
import multiprocessing
import os
import pathlib
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def http_get(host, port, path, timeout=5.0):
    """A tiny blocking GET: (status, body)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    if b"transfer-encoding: chunked" in head.lower():
        out, rest = b"", body
        while rest:
            size_line, _, rest = rest.partition(b"\r\n")
            n = int(size_line.split(b";")[0], 16)
            if n == 0:
                break
            out, rest = out + rest[:n], rest[n + 2:]
        body = out
    return status, body


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def stream_request(host, port, path, body, key, result):
    """One streaming request; fills result with ok, ttft, tokens, error."""
    t0 = time.perf_counter()
    try:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    except OSError as e:
        result["error"] = f"connect: {e}"
        return
    payload = json.dumps(body).encode()
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    writer.write((f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}"
                  f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode() + payload)
    try:
        await writer.drain()
        status_line = await reader.readline()
        status = int(status_line.split()[1])
        chunked = False
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            if line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower():
                chunked = True
        if status != 200:
            result["error"] = f"HTTP {status}: {(await reader.read(500)).decode(errors='replace')}"
            return
        buf = b""
        done = False
        while not done:
            if chunked:
                size_line = await reader.readline()
                if not size_line:
                    break
                n = int(size_line.split(b";")[0], 16)
                if n == 0:
                    break
                data = await reader.readexactly(n)
                await reader.readexactly(2)
            else:
                data = await reader.read(65536)
                if not data:
                    break
            buf += data
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                payload = event[6:]
                if payload == b"[DONE]":
                    done = True
                    break
                ev = json.loads(payload)
                if "error" in ev:
                    result["error"] = ev["error"].get("message")
                    return
                for c in ev.get("choices") or []:
                    piece = c.get("text") or (c.get("delta") or {}).get("content") or ""
                    if piece and "ttft" not in result:
                        result["ttft"] = time.perf_counter() - t0
                    result["chunks"] = result.get("chunks", 0) + (1 if piece else 0)
                if ev.get("usage"):
                    result["tokens"] = ev["usage"]["completion_tokens"]
        result["ok"] = done
        if not done:
            result["error"] = "stream ended without [DONE]"
        result["latency"] = time.perf_counter() - t0
        result.setdefault("tokens", result.get("chunks", 0))
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        writer.close()


async def run_load(args, host, port, clients, n_requests):
    results = []
    sem = asyncio.Semaphore(clients)
    path = "/v1/chat/completions" if args.chat else "/v1/completions"

    async def one(i):
        async with sem:
            body = {"max_tokens": args.max_tokens, "stream": True, "temperature": args.temperature,
                    "stream_options": {"include_usage": True}}
            if args.model:
                body["model"] = args.model
            if args.ignore_eos:
                body["ignore_eos"] = True
            text = f"{args.prompt} (request {i})"
            if args.chat:
                body["messages"] = [{"role": "user", "content": text}]
            else:
                body["prompt"] = text
            r = {}
            await stream_request(host, port, path, body, args.api_key, r)
            results.append(r)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n_requests)))
    return results, time.perf_counter() - t0


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def probe_health(host, port, stop, conn):
    """In its own process: GET /health every 50 ms until stop is set; sends (latencies, bad)."""
    lat, bad = [], 0
    while not stop.is_set():
        t = time.perf_counter()
        try:
            status, _ = http_get(host, port, "/health", timeout=5)
        except OSError:
            status = 0
        lat.append(time.perf_counter() - t)
        bad += status != 200
        time.sleep(0.05)
    conn.send((lat, bad))


class HealthProbe:
    def __init__(self, host, port):
        ctx = multiprocessing.get_context("fork")
        self.stop_ev = ctx.Event()
        self.recv, send = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=probe_health, args=(host, port, self.stop_ev, send), daemon=True)
        self.lat, self.bad = [], 0

    def start(self):
        self.proc.start()

    def stop(self):
        self.stop_ev.set()
        self.lat, self.bad = self.recv.recv()
        self.proc.join()


def failure_kind(err):
    """A short class of an error message, for counting failures by kind."""
    err = str(err)
    if err.startswith("HTTP "):
        return err.split(":", 1)[0]
    if err.startswith("connect:"):
        return "connect: " + err.split(":", 2)[1].strip()[:40]
    return err.split(":", 1)[0][:60]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running server (default: start kaon serve)")
    ap.add_argument("--clients", default="1000", help="concurrency, or a comma list (1,8,32)")
    ap.add_argument("--requests", type=int, default=0, help="requests per level (default: = clients)")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--ignore-eos", action="store_true", help="always generate max-tokens tokens")
    ap.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    ap.add_argument("--prompt", default="Write one sentence about the sea")
    ap.add_argument("--model", help="the model field (default: none)")
    ap.add_argument("--api-key")
    ap.add_argument("--threads", type=int, default=0, help="kaon serve --threads")
    ap.add_argument("--serve-args", default="", help="extra kaon serve arguments")
    ap.add_argument("--json", help="append results as JSON lines here")
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    proc = None
    if args.url:
        hostport = args.url.split("//", 1)[-1].rstrip("/")
        host, port = hostport.rsplit(":", 1)
        port = int(port)
    else:
        build = pathlib.Path(os.environ.get("KAON_BUILD", REPO / "build"))
        tmp = tempfile.mkdtemp(prefix="kaon-bench-")
        port_file = pathlib.Path(tmp) / "port"
        cmd = [str(build / "kaon"), "serve", "--port", "0", "--port-file", str(port_file)]
        if args.threads:
            cmd += ["--threads", str(args.threads)]
        cmd += args.serve_args.split()
        log = open(pathlib.Path(tmp) / "server.log", "wb")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None:
                sys.exit(f"kaon serve exited: see {tmp}/server.log")
            time.sleep(0.05)
        host, port = port_file.read_text().split()
        port = int(port)
    while True:
        try:
            if http_get(host, port, "/health")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)

    levels = [int(x) for x in args.clients.split(",")]
    warm = asyncio.run(run_load(args, host, port, min(8, levels[0]), min(8, levels[0])))
    if not all(r.get("ok") for r in warm[0]):
        sys.exit(f"warm-up failed: {[r.get('error') for r in warm[0] if not r.get('ok')][:3]}")
    time.sleep(1.5)  # the server trims freed memory when idle
    rss_before = rss_mib(proc.pid) if proc else None

    out = []
    for clients in levels:
        n = args.requests or clients
        probe = HealthProbe(host, port)
        probe.start()
        results, wall = asyncio.run(run_load(args, host, port, clients, n))
        probe.stop()
        ok = [r for r in results if r.get("ok")]
        ttft = [r["ttft"] for r in ok if "ttft" in r]
        tokens = sum(r.get("tokens", 0) for r in ok)
        row = {"clients": clients, "requests": n, "ok": len(ok), "success_pct": 100.0 * len(ok) / n,
               "wall_s": round(wall, 2), "output_tokens": tokens,
               "output_tok_per_s": round(tokens / wall, 1),
               "ttft_p50_s": round(pct(ttft, 50), 3), "ttft_p99_s": round(pct(ttft, 99), 3),
               "health_p50_ms": round(1000 * pct(probe.lat, 50), 1) if probe.lat else None,
               "health_max_ms": round(1000 * max(probe.lat), 1) if probe.lat else None,
               "health_p99_ms": round(1000 * pct(probe.lat, 99), 1) if probe.lat else None,
               "health_probes": len(probe.lat), "health_failures": probe.bad,
               "failures": dict(collections.Counter(failure_kind(r.get("error")) for r in results
                                                    if not r.get("ok"))),
               "errors": sorted({str(r.get("error"))[:120] for r in results if not r.get("ok")})[:5]}
        out.append(row)
        print(json.dumps(row), flush=True)

    if proc:
        # Idle again: KV usage back to 0 and RSS near where it started.
        deadline = time.time() + 60
        kv = running = None
        while time.time() < deadline:
            m = http_get(host, port, "/metrics")[1].decode()
            kv, running = metric(m, "kaon:kv_cache_usage_perc"), metric(m, "kaon:num_requests_running")
            waiting = metric(m, "kaon:num_requests_waiting")
            if kv == 0 and running == 0 and waiting == 0:
                break
            time.sleep(0.2)
        time.sleep(1.5)
        rss_after = rss_mib(proc.pid)
        summary = {"kv_usage_after": kv, "running_after": running, "rss_before_mib": round(rss_before, 1),
                   "rss_after_mib": round(rss_after, 1),
                   "rss_change_pct": round(100 * (rss_after - rss_before) / rss_before, 1)}
        print(json.dumps(summary), flush=True)
        out.append(summary)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    if args.json:
        with open(args.json, "a") as f:
            for row in out:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
