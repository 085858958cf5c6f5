"""kaon serve as a multi-node job on this one machine: mpirun -np 3 kaon serve -tp 3. Process 0
serves the OpenAI API, schedules and samples; processes 1 and 2 hold ranks 1 and 2 of the
default model (three KV heads, one each) and run every step process 0 sends them
(src/dist/cluster.h). The answers must be those of the same server with its three ranks as
threads of one process (the same sums, bit for bit: dist/reduce.h), streamed or not; an idle
job must leave the cores idle (the followers wait for their next step without spinning); and
SIGTERM to mpirun must end the job cleanly (process 0 drains, then stops its followers).
"""
import os
import pathlib
import signal
import sys
import time

import openai
import pytest

from conftest import BUILD, MODEL, Server

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "ref"))
from mpi_launch import ENV, mpirun  # noqa: E402

# Under a sanitizer build the MPI library's own allocations at exit would be reported.
pytestmark = pytest.mark.skipif("asan" in BUILD.name or "tsan" in BUILD.name,
                                reason="Open MPI is not built for the sanitizers")

ARGS = ["--served-model-name", "smol", "--max-model-len", "512", "--kv-cache-memory", "32M", "--threads", "1",
        "-tp", "3"]
PROMPTS = ["Name three colours.", "What is the capital of France?", "Count from one to five."]


def answers(server):
    c = openai.OpenAI(base_url=server.base + "/v1", api_key="none", max_retries=0, timeout=300)
    out = []
    for p in PROMPTS:
        r = c.chat.completions.create(model="smol", messages=[{"role": "user", "content": p}], temperature=0,
                                      max_tokens=24)
        out.append((r.choices[0].message.content, r.choices[0].finish_reason))
    stream = c.chat.completions.create(model="smol", messages=[{"role": "user", "content": PROMPTS[0]}],
                                       temperature=0, max_tokens=24, stream=True)
    out.append(("".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices), "stream"))
    return out


def cpu_seconds(pid):
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def kaon_children(pid):
    """The kaon processes mpirun started (its children, or its daemon's)."""
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            cmd = (d / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if cmd.endswith(b"/kaon") and int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(d.name))
    return found


def rank_metrics(server):
    """{series: {rank: value}} of the kaon:rank_* series."""
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for fam in text_string_to_metric_families(server.metrics()):
        for smp in fam.samples:
            if smp.name.startswith("kaon:rank_"):
                out.setdefault(smp.name, {})[int(smp.labels["rank"])] = smp.value
    return out


def check_rank_metrics(m, n):
    """Each rank's shard: the split tensors (q, k, v, o, gate, up, down) cut N ways, the rest
    (embedding, norms, LM head) whole on every rank, so the ranks' bytes add up to the split
    tensors once plus the others N times (the gguf package's sizes of the file's tensors)."""
    import gguf
    split = whole = 0
    for t in gguf.GGUFReader(MODEL).tensors:
        if any(k in t.name for k in ("attn_q.", "attn_k.", "attn_v.", "attn_output.", "ffn_gate.", "ffn_up.",
                                     "ffn_down.")):
            split += int(t.n_bytes)
        else:
            whole += int(t.n_bytes)
    w = m["kaon:rank_weight_bytes"]
    assert sorted(w) == list(range(n))
    assert sum(w.values()) == split + n * whole, (w, split, whole)
    kv = m["kaon:rank_kv_cache_bytes"]
    assert len(set(kv.values())) == 1 and kv[0] > 0  # one KV head each of the three
    steps = m["kaon:rank_steps_total"]
    assert len(set(steps.values())) == 1 and steps[0] > 0  # every rank runs every step
    for r in range(n):
        assert 0 <= m["kaon:rank_collective_seconds_total"][r] <= m["kaon:rank_step_seconds_total"][r]


def test_serve_over_three_processes_answers_as_threads():
    one = Server(ARGS)
    try:
        want = answers(one)
        check_rank_metrics(rank_metrics(one), 3)
    finally:
        one.stop()
    job = Server(ARGS, launcher=mpirun(3), env=ENV)
    try:
        assert answers(job) == want
        assert sorted(rank_metrics(job)["kaon:rank_steps_total"]) == [0]  # process 0's rank only
        assert all(text for text, _ in want)
        kids = kaon_children(job.proc.pid)
        assert len(kids) == 3, kids
        before = {p: cpu_seconds(p) for p in kids}
        time.sleep(3)
        used = {p: cpu_seconds(p) - before[p] for p in kids}
        assert max(used.values()) < 0.6, f"CPU seconds used in 3 idle seconds: {used}"
        job.proc.send_signal(signal.SIGTERM)
        job.proc.wait(timeout=60)  # mpirun's own status after a signal says only that it had one
        out = job.output()
        assert "serve: stopped" in out and out.count("process 0 ended the job") == 2, out
        assert "ending every process" not in out and "MPI_ABORT" not in out, out
    finally:
        job.stop()


def running(pid):
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_follower_killed_ends_the_job():
    """A follower that dies (kill -9: no message, no MPI_Abort of its own) must not leave process 0
    serving requests that would wait for it forever: mpirun ends the whole job."""
    job = Server(ARGS, launcher=mpirun(3), env=ENV)
    try:
        kids = sorted(kaon_children(job.proc.pid))
        assert len(kids) == 3, kids
        ranks = {int(dict(kv.split(b"=", 1) for kv in pathlib.Path(f"/proc/{p}/environ").read_bytes().split(b"\0")
                          if b"=" in kv)[b"OMPI_COMM_WORLD_RANK"]): p for p in kids}
        follower = ranks[1]
        os.kill(follower, signal.SIGKILL)
        job.proc.wait(timeout=60)
        # mpirun may return while the others are still on their way out (process 0 drains on
        # the SIGTERM mpirun sends first): each must be gone within the server's drain time.
        deadline = time.time() + 30
        alive = kids
        while alive and time.time() < deadline:
            alive = [p for p in alive if running(p)]
            time.sleep(0.1)
        assert not alive, f"processes {alive} outlived the job by 30 s"
    finally:
        job.stop()
