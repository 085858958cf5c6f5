"""`kaon info` counts weights through the architecture's weight table: its per-format tensor
counts, parameters and bytes must equal what the `gguf` package reads from the same files
(every tensor of these files is a weight), and each table row it prints must be a real tensor
kind of the file."""
import re
import subprocess
from pathlib import Path

import gguf
import pytest

SEEDS = Path(__file__).resolve().parents[1] / "fuzz" / "seeds" / "model_gguf"
FORMATS = re.compile(r" (\w+) x(\d+) \(([\d.]+) M params, ([\d.]+) MiB\)")


def reference_counts(path):
    counts = {}
    for t in gguf.GGUFReader(path).tensors:
        name = t.tensor_type.name
        n, params, nbytes = counts.get(name, (0, 0, 0))
        counts[name] = (n + 1, params + int(t.n_elements), nbytes + int(t.n_bytes))
    return counts


def info(kaon_bin, path):
    r = subprocess.run([str(kaon_bin), "info", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("name", ["default", "mixtral-q8_0.gguf", "qwen2moe.gguf", "qwen3.gguf"])
def test_info_formats_match_gguf(kaon_bin, default_model, name):
    path = default_model if name == "default" else SEEDS / name
    out = info(kaon_bin, path)
    line = next(l for l in out.splitlines() if l.startswith("weight formats:"))
    got = {m[0]: (int(m[1]), float(m[2]), float(m[3])) for m in FORMATS.findall(line)}
    want = reference_counts(path)
    assert set(got) == set(want), (got, want)
    for k, (n, params, nbytes) in want.items():
        gn, gp, gb = got[k]
        assert gn == n, (k, gn, n)
        assert abs(gp - params / 1e6) <= 0.051, (k, gp, params)
        assert abs(gb - nbytes / 1048576) <= 0.051, (k, gb, nbytes)
    total = int(re.search(r"parameters:\s+[\d.]+ M \((\d+)\)", out).group(1))
    assert total == sum(p for _, p, _ in want.values())
    # Every row printed from the table names tensors the file has.
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    rows = re.findall(r"^  (\S+)\s+x(\d+)\s", out, re.M)
    assert rows
    for pattern, n in rows:
        if "*" in pattern:  # the experts' row (any layout)
            continue
        regex = re.compile("^" + re.escape(pattern).replace("N", r"\d+") + "$")
        assert sum(1 for t in names if regex.match(t)) == int(n), (pattern, n)
