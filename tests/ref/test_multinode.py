"""Multi-node jobs on the CPU (src/dist/cluster.c, comm_mpi.c; model/tp.c's followers): mpirun
starts N processes of `kaon`, process 0 runs the command and each step it runs is sent to the
others, which hold their ranks' shards and join the step's collectives over MPI.

What must hold: the same logits, bit for bit, as the same tensor-parallel layout run as threads
of one process (both communicators sum in rank order: dist/reduce.h), so the bounds of
test_tensor_parallel.py against one rank hold too; the same greedy ids as one rank in batched,
chunked generation; layouts the job cannot run, processes started with different settings, and
a step that fails on one process end the whole job with an error (exit status != 0, one line
naming the cause), never a hang.
"""
import json
import subprocess

import numpy as np
import pytest

from mpi_launch import env, mpirun
from test_tensor_parallel import check_close, generate, prompts
from test_tensor_parallel_moe import build, par_flags

IDS = [1, 17, 250, 3, 99, 42, 42, 7, 120, 299, 0, 5, 64, 200, 11, 13, 8, 150, 77, 31]


def run_job(np_, cmd, env_vars=(), extra_env=None, timeout=300):
    return subprocess.run(mpirun(np_, env_vars) + [str(c) for c in cmd], capture_output=True, text=True,
                          timeout=timeout, env=env(extra_env))


def logits_cmd(exe, model, out, flags, mode):
    cmd = [exe, "logits", "-m", model, "--prompt-ids", ",".join(map(str, IDS)), "-o", out, "--threads", "1", *flags]
    return cmd + (["--decode"] if mode == "decode" else ["--chunk", "7"] if mode == "chunk7" else [])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("multinode")
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = build(d, name) if name != "llama" else build_llama(d)
        return cache[name]
    return get


def build_llama(d):
    from tiny_models import make_config, make_weights, save_hf
    cfg = make_config("llama")
    return save_hf(d / "llama", cfg, make_weights(cfg, seed=11), "F32")


@pytest.mark.parametrize("name,par", [("llama", "tp2"), ("llama", "tp4"), ("qwen3moe", "tp2"), ("qwen3moe", "ep2"),
                                      ("ds-v3", "tp2"), ("ds-v3", "ep4")])
@pytest.mark.parametrize("mode", ["prefill", "decode", "chunk7"])
def test_logits_same_bits_as_threads(kaon_bin, models, tmp_path, name, par, mode):
    model = models(name)
    n = int(par[2:])
    outs = {}
    for how in ("one", "threads", "processes"):
        out = tmp_path / f"{how}.f32"
        flags = par_flags("one" if how == "one" else par)
        cmd = logits_cmd(kaon_bin, model, out, flags, mode)
        r = run_job(n, cmd) if how == "processes" else subprocess.run([str(c) for c in cmd], capture_output=True,
                                                                       text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        outs[how] = np.fromfile(out, dtype=np.float32).reshape(len(IDS), -1)
    assert np.array_equal(outs["processes"], outs["threads"]), f"{name} {par} {mode}: processes differ from threads"
    check_close(outs["processes"], outs["one"], f"{name} {par} {mode} over {n} processes")


@pytest.mark.parametrize("name,par", [("llama", "tp2"), ("qwen3moe", "ep2"), ("ds-v2-lite", "tp2")])
def test_batched_chunked_greedy_ids(kaon_bin, models, tmp_path, name, par):
    model = models(name)
    ps = prompts(12, seed=3)
    extra = ["--max-num-seqs", "6", "--max-num-batched-tokens", "24", "--no-prefix-caching"]
    one, _ = generate(kaon_bin, model, tmp_path, ps, 1, extra, name="one")
    inp, out = tmp_path / "job.in.jsonl", tmp_path / "job.out.jsonl"
    inp.write_text((tmp_path / "one-1.in.jsonl").read_text())
    n = int(par[2:])
    r = run_job(n, [kaon_bin, "generate", "-m", model, "--input", inp, "--output", out, "--threads", "1", "--quiet",
                    "--temp", "0", "--max-tokens", "12", "--ignore-eos", *par_flags(par), *extra])
    assert r.returncode == 0, r.stderr
    many = [json.loads(line)["token_ids"] for line in out.read_text().splitlines()]
    assert many == one
    # Every follower ran the job's steps and was ended by process 0, not killed.
    assert r.stderr.count("process 0 ended the job") == n - 1, r.stderr


@pytest.mark.parametrize("np_,tp,words", [
    (2, 1, "needs --tensor-parallel-size a multiple of 2"),
    (2, 3, "needs --tensor-parallel-size a multiple of 2"),
    (2, 4, "one rank per process"),
])
def test_layouts_refused(kaon_bin, models, tmp_path, np_, tp, words):
    r = run_job(np_, logits_cmd(kaon_bin, models("llama"), tmp_path / "x.f32", ["-tp", str(tp)], "prefill"),
                timeout=120)
    assert r.returncode != 0
    assert words in r.stderr, r.stderr


def test_processes_must_agree(kaon_bin, models, tmp_path):
    """Process 1 started with another --max-num-batched-tokens (Open MPI's MPMD form)."""
    model = models("llama")
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt_ids": [1, 2, 3]}\n')

    def part(tokens):
        return [str(c) for c in [kaon_bin, "generate", "-m", model, "--input", inp, "--output", tmp_path / "o.jsonl",
                                 "--threads", "1", "--quiet", "--max-tokens", "2", "-tp", "2", "--max-num-seqs", "4",
                                 "--max-num-batched-tokens", tokens]]
    launcher = mpirun(1)
    cmd = launcher + part("32") + [":", "-np", "1"] + part("64")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env())
    assert r.returncode != 0
    assert "process 1 has --max-num-batched-tokens 64, process 0 32" in r.stderr, r.stderr


def test_failed_step_ends_the_job(kaon_bin, models, tmp_path):
    """Rank 1 (process 1) fails its third step before any collective (KAON_TP_FAIL): its peer in
    process 0 would wait in that step's first collective forever; the job ends instead."""
    model = models("llama")
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"prompt_ids": [1, 2, 3]}\n')
    r = run_job(2, [kaon_bin, "generate", "-m", model, "--input", inp, "--output", tmp_path / "o.jsonl", "--threads",
                    "1", "--quiet", "--max-tokens", "8", "--ignore-eos", "-tp", "2"],
                env_vars=["KAON_TP_FAIL"], extra_env={"KAON_TP_FAIL": "1:2"}, timeout=120)
    assert r.returncode != 0
    assert "injected failure (KAON_TP_FAIL=1:2)" in r.stderr, r.stderr
    assert "ending every process of the job" in r.stderr, r.stderr


def test_torchrun_style_flags_point_to_mpirun(kaon_bin):
    r = subprocess.run([str(kaon_bin), "serve", "--nnodes", "2", "--node-rank", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert "mpirun or srun" in r.stderr, r.stderr
