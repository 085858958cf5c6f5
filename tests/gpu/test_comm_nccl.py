"""The NCCL communicator (src/dist/comm_nccl.c) on the GPU machine: world size 1 through the same
code path as many GPUs (every collective: all_reduce, all_gather, reduce_scatter, all_to_allv,
broadcast, barrier, in f32, bf16 and i32), and world size = every GPU of the host when there are
several (one thread per GPU in one process).

The driver is built here from tests/gpu/comm_nccl_driver.c against $KAON_BUILD/libkaon.a (a
CUDA build configured where NCCL was found: its CMake log says "NCCL: ..."):

    KAON_BUILD=build-gpu python3 -m pytest -q tests/gpu/test_comm_nccl.py
"""
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("KAON_BUILD", REPO / "build"))


def n_gpus():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def build_driver(exe):
    """Builds tests/gpu/comm_nccl_driver.c at exe (also used by bench/multigpu.sh for its bench mode)."""
    lib = BUILD / "libkaon.a"
    if not lib.exists():
        pytest.fail(f"{lib} missing: build kaon with CUDA first (KAON_BUILD)")
    cache = BUILD / "CMakeCache.txt"
    if cache.exists() and "KAON_NCCL_LIB:FILEPATH=" in cache.read_text() and \
            "KAON_NCCL_LIB-NOTFOUND" in cache.read_text():
        pytest.fail("this build has no NCCL (CMake did not find libnccl / nccl.h)")
    libs = subprocess.run(["pkg-config", "--libs", "libpcre2-8", "libcjson"], capture_output=True,
                          text=True).stdout.split()
    mhd = subprocess.run(["pkg-config", "--libs", "libmicrohttpd"], capture_output=True, text=True).stdout.split()
    cmd = ["gcc", "-std=c11", "-O2", "-Wall", "-Wextra", "-D_GNU_SOURCE", "-I", str(REPO / "include"),
           "-I", str(REPO / "src"), "-I/usr/local/cuda/include", str(REPO / "tests/gpu/comm_nccl_driver.c"),
           str(lib), "-L/usr/local/cuda/lib64", "-L/usr/local/lib", "-Wl,-rpath,/usr/local/cuda/lib64",
           "-Wl,-rpath,/usr/local/lib", "-lnccl", "-lcublasLt", "-lcudart", "-lstdc++", *libs, *mhd,
           "-fopenmp", "-lm", "-lpthread", "-ldl", "-lrt", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    return exe


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return build_driver(tmp_path_factory.mktemp("comm") / "comm_nccl_driver")


def run(driver, n, env=None, args=()):
    r = subprocess.run([str(driver), str(n), *args], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **(env or {})))
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count(": ok") == n


def test_nccl_world_size_1(driver):
    if n_gpus() < 1:
        pytest.fail("no GPU")
    run(driver, 1)


@pytest.mark.parametrize("p2p", ["on", "off"])
def test_nccl_all_gpus(driver, p2p):
    # on: small all-reduces go one-shot over peer memory (src/dist/allreduce_p2p.cu); off: NCCL only.
    # KAON_NCCL_WORLD=N (bench/multigpu.sh N): world size N, which must not exceed the GPUs visible.
    n = int(os.environ.get("KAON_NCCL_WORLD", n_gpus()))
    if n > n_gpus():
        pytest.fail(f"KAON_NCCL_WORLD={n} but {n_gpus()} GPUs are visible")
    if n < 2:
        pytest.skip("one GPU: world size 1 only")
    run(driver, n, {"KAON_P2P_AR": "0"} if p2p == "off" else None)


def test_p2p_kernel_same_device(driver):
    # The one-shot all-reduce kernel alone, 2 ranks on GPU 0 (no NCCL): sums in rank order at
    # 16 B .. 12 MB, both parities, in place, and graph replays, on a one-GPU machine too. Only
    # 2: the ranks' blocks must all be resident at once (they wait for each other), and 4 x 64
    # blocks of 512 threads do not fit one H200 (seen: the 120 s watchdog stopped it).
    if n_gpus() < 1:
        pytest.fail("no GPU")
    run(driver, 2, args=("same",))
