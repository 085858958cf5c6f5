"""Many open streams on a few threads (issue 23): generation requests waiting for the engine are
parked (their connections suspended), not given a thread each, so the server's thread count
stays small, /health answers at once while hundreds of streams wait, and every stream and whole
response still completes. Also: the start-up warning when the file-descriptor limit is too low
for --max-connections. The 10,000-client figures come from bench_load.py (docs/PERF.md)."""
import asyncio
import json
import resource
import time

from conftest import Server

STREAMS = 100
WHOLE = 12


def threads_of(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return -1


async def one(host, port, i, stream):
    """One completion request over a raw socket; returns (ok, detail). A short prompt without a
    chat template's system text: the test is about waiting connections, not prefill work."""
    body = json.dumps({"model": "smol", "prompt": f"Hi {i}", "max_tokens": 2, "stream": stream,
                       "ignore_eos": True}).encode()
    reader, writer = await asyncio.open_connection(host, port)
    writer.write((f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\n"
                  f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                  f"Connection: close\r\n\r\n").encode() + body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, rest = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return False, head[:200]
    if stream:
        return b"data: [DONE]" in rest, rest[-200:]
    return b'"finish_reason":"length"' in rest, rest[-200:]


async def load_and_probe(s):
    tasks = [asyncio.create_task(one(s.host, s.port, i, i >= STREAMS))
             for i in range(STREAMS + WHOLE)]
    await asyncio.sleep(1.0)
    # While most requests wait for one of the 8 running slots: few threads, /health quick.
    health, max_threads = [], 0
    for _ in range(10):
        t = time.perf_counter()
        status, _, _ = await asyncio.to_thread(s.request, "GET", "/health")
        health.append((status, time.perf_counter() - t))
        max_threads = max(max_threads, threads_of(s.proc.pid))
        await asyncio.sleep(0.05)
    results = await asyncio.gather(*tasks)
    return results, health, max_threads


def test_many_parked_streams_few_threads():
    s = Server(["--served-model-name", "smol", "--max-num-seqs", "8", "--max-model-len", "256"])
    try:
        results, health, max_threads = asyncio.run(load_and_probe(s))
        bad = [d for ok, d in results if not ok]
        assert not bad, bad[:3]
        assert all(st == 200 for st, _ in health), health
        # Generous for sanitizer builds; a thread per connection would show hundreds.
        assert max(t for _, t in health) < 2.0, health
        assert max_threads < 40, max_threads
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.output()


def test_fd_limit_warning():
    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, 512))

    s = Server(["--served-model-name", "smol"], preexec_fn=low_limit)
    try:
        out = s.output()
        assert "file-descriptor limit is 512" in out, out
        assert "serving at most 320" in out, out
    finally:
        s.stop()
