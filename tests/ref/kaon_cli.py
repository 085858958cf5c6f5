"""Running the kaon binary from the tests: `kaon logits` (a prompt's logits, read back as a
[tokens, vocab] float32 array) and `kaon run --temp 0` (greedy ids). A failing command fails the
test with kaon's own error message."""
import json
import subprocess
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest


class NotYet(NamedTuple):
    """How to report a model family kaon does not run yet: the failure message, and the words of
    kaon's error that mean it."""
    message: str
    markers: tuple = ("unsupported architecture",)


def run(cmd, not_yet=None):
    """Runs one kaon command line (items made str) and returns the CompletedProcess."""
    cmd = [str(c) for c in cmd]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        why = r.stderr.strip()
        if not_yet and any(m in why for m in not_yet.markers):
            pytest.fail(f"{not_yet.message}: {why}")
        pytest.fail(f"{' '.join(cmd[:2])} failed (rc {r.returncode}): {why}")
    return r


def logits(exe, model, ids, tmp_path, mode="prefill", threads=2, not_yet=None):
    """kaon's logits of ids [len(ids), vocab]. mode: prefill (one batch), decode (one token per
    step) or chunkN (prefill N at a time)."""
    out = Path(tmp_path) / f"logits-{mode}-{len(ids)}.f32"
    cmd = [exe, "logits", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-o", out, "--threads", threads]
    if mode == "decode":
        cmd.append("--decode")
    elif mode.startswith("chunk"):
        cmd += ["--chunk", mode[5:]]
    run(cmd, not_yet)
    a = np.fromfile(out, dtype=np.float32)
    out.unlink()
    return a.reshape(len(ids), -1)


def greedy(exe, model, ids, n, threads=2, not_yet=None):
    """The n ids `kaon run --temp 0 --ignore-eos` continues ids with."""
    r = run([exe, "run", "-m", model, "--prompt-ids", ",".join(map(str, ids)), "-n", n, "--temp", "0",
             "--ignore-eos", "--print-ids", "--threads", threads], not_yet)
    return json.loads(r.stdout.strip().splitlines()[-1])
