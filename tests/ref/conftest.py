import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def build_dir():
    return Path(os.environ.get("KAON_BUILD", REPO / "build"))


@pytest.fixture(scope="session")
def kaon_bin():
    exe = build_dir() / "kaon"
    if not exe.exists():
        pytest.fail(f"kaon binary not found at {exe}: build first (or set KAON_BUILD)")
    return exe


@pytest.fixture(scope="session")
def default_model():
    if not DEFAULT_MODEL.exists():
        pytest.fail(f"default model missing at {DEFAULT_MODEL}: run scripts/setup.sh")
    return DEFAULT_MODEL


def kaon_logits(exe, model, ids, tmp_path, decode=False, threads=2, extra=()):
    out = tmp_path / f"logits-{os.getpid()}-{len(ids)}-{int(decode)}.f32"
    cmd = [str(exe), "logits", "-m", str(model), "--prompt-ids", ",".join(map(str, ids)),
           "-o", str(out), "--threads", str(threads)]
    if decode:
        cmd.append("--decode")
    cmd += list(extra)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"kaon logits failed: {r.stderr}"
    a = np.fromfile(out, dtype=np.float32)
    out.unlink()
    return a.reshape(len(ids), -1)
