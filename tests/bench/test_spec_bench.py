"""bench/spec_decode.py on the CPU with the default model: the oracle's drafts are all accepted
(k drafts: k + 1 tokens per verify step), every run's ids equal the plain run's, and the results
file holds a row per variant."""
import json
import subprocess
import sys

from conftest import BUILD, MODEL, REPO


def test_spec_bench_oracle_and_ngram(tmp_path):
    out = tmp_path / "spec.json"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "spec_decode.py"), "--kaon", str(BUILD / "kaon"),
                        "--model", str(MODEL), "--threads", "2", "--tokens", "24", "--k", "1,2",
                        "--vocab", "49152", "--output-json", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["variant"]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"plain", "oracle k=1", "oracle k=2", "plain (loop prompt)", "ngram k=4 (loop prompt)"}
    for k in (1, 2):
        row = rows[f"oracle k={k}"]
        assert row["same_ids"] and row["accepted"] == row["drafted"] > 0, row
        # k + 1 tokens per verify step, but for the last steps, whose drafts max_tokens trims.
        assert k + 0.5 < row["acceptance_length"] <= k + 1, row
    assert rows["ngram k=4 (loop prompt)"]["same_ids"]
    assert all(row["generated"] == 24 for row in rows.values())
