"""Ctrl-C during LLM.generate: the call raises KeyboardInterrupt, its requests are aborted, and
the same LLM serves the next call. Once with a real SIGINT to a child process, once in-process.

Both install Python's own SIGINT handler first: a process started in the background by a
non-interactive shell inherits SIGINT ignored, and Python then installs no handler (a real
SIGINT is dropped, _thread.interrupt_main does nothing), which is not what these tests test."""
import _thread
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import ENGINE_ARGS, MODEL
from kaon import SamplingParams

CHILD = r"""
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from kaon import LLM, SamplingParams
llm = LLM(sys.argv[1], max_model_len=1024, kv_cache_memory_bytes=96 << 20)
print("ready", flush=True)
t0 = time.time()
try:
    llm.generate(["Count slowly:"] * 4, SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True))
    print("finished?!", flush=True)
except KeyboardInterrupt:
    print("interrupted after %.1f s" % (time.time() - t0), flush=True)
out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=5))
print("after", out[0].outputs[0].token_ids, out[0].outputs[0].finish_reason, flush=True)
"""


def test_sigint_aborts_generate_and_llm_stays_usable():
    env = dict(os.environ)
    import kaon
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(kaon.__file__)) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.Popen([sys.executable, "-c", CHILD, MODEL], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("interrupted after"), out
    assert float(lines[0].split()[2]) < 10  # 4 x 1000 tokens would take far longer
    assert lines[1] == "after [7042, 30, 198, 198, 504] length", out


def test_interrupt_in_process(llm):
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupt_generate(llm)
    finally:
        signal.signal(signal.SIGINT, old)


def interrupt_generate(llm):
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    t0 = time.time()
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["Count slowly:"] * 3, SamplingParams(temperature=0, max_tokens=1000, ignore_eos=True))
    assert time.time() - t0 < 10
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=5))
    assert out[0].outputs[0].token_ids == [7042, 30, 198, 198, 504]
