#!/usr/bin/env python3
"""Structured outputs on the CUDA path: `kaon serve --device cuda --load-format dummy` on a real
config (random weights, so the logits fight every grammar) with bench/dummy_model.py's tokenizer,
asked through /v1/completions for choices, a regex, a GBNF grammar, json_object and JSON Schemas
(tests/e2e/schemas200.py's first N), n = 4 at temperature 1. Every output that finishes must match
(`re`, `json`, `jsonschema`); prints the counts and the server's mask time per token.

    python3 tests/gpu/structured_cuda.py [--config bench/configs/meta-llama__Llama-3.1-8B-Instruct.json] [--schemas 20]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
sys.path.insert(0, str(REPO / "bench"))
import schemas200  # noqa: E402
import dummy_model  # noqa: E402


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(REPO / "bench/configs/meta-llama__Llama-3.1-8B-Instruct.json"))
    ap.add_argument("--kaon", default=str(REPO / "build-gpu" / "kaon"))
    ap.add_argument("--schemas", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    import jsonschema
    tmp = Path(tempfile.mkdtemp(prefix="kaon-so-"))
    dummy_model.make(args.config, tmp / "model")
    port_file = tmp / "port"
    log = open(tmp / "server.log", "wb")
    proc = subprocess.Popen([args.kaon, "serve", str(tmp / "model"), "--load-format", "dummy", "--device", args.device,
                             "--port", "0", "--port-file", str(port_file), "--max-model-len", "2048"],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not (port_file.exists() and port_file.read_text().strip()):
        assert proc.poll() is None and time.time() < deadline, (tmp / "server.log").read_text()[-3000:]
        time.sleep(0.2)
    host, port = port_file.read_text().split()
    url = f"http://{host}:{port}"
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert proc.poll() is None and time.time() < deadline, (tmp / "server.log").read_text()[-3000:]
        time.sleep(0.5)
    cases = [("choice", {"structured_outputs": {"choice": ["alpha", "beta gamma", "delta"]}},
              lambda t: t in ("alpha", "beta gamma", "delta")),
             ("regex", {"structured_outputs": {"regex": r"[A-Z][a-z]{2,8} [0-9]{1,3}(\.[0-9])?"}},
              lambda t: re.fullmatch(r"[A-Z][a-z]{2,8} [0-9]{1,3}(\.[0-9])?", t)),
             ("grammar", {"structured_outputs": {"grammar": 'root ::= "x=" [0-9]{1,4} (", y=" [a-c]{1,3})?'}},
              lambda t: re.fullmatch(r"x=[0-9]{1,4}(, y=[a-c]{1,3})?", t)),
             ("json_object", {"response_format": {"type": "json_object"}},
              lambda t: isinstance(json.loads(t), dict))]
    for it in schemas200.make_schemas(args.schemas):
        s = it["schema"]
        cases.append((it["name"], {"response_format": {"type": "json_schema", "json_schema": {
            "name": it["name"], "schema": s, "strict": True}}},
            lambda t, s=s: jsonschema.validate(json.loads(t), s) is None))
    failed = total = length = 0
    t0 = time.time()
    for name, extra, check in cases:
        st, r = post(url + "/v1/completions", {"prompt": "Answer:", "max_tokens": 512, "n": 4,
                                               "temperature": 1.0, "seed": 1, **extra})
        if st != 200:
            print(f"{name}: HTTP {st} {r}")
            failed += 1
            continue
        for c in r["choices"]:
            total += 1
            if c["finish_reason"] == "length":
                length += 1
                continue
            try:
                ok = c["finish_reason"] == "stop" and check(c["text"])
            except Exception as e:  # noqa: BLE001
                ok = False
                print(f"  {name}: {type(e).__name__}: {str(e)[:160]}")
            if not ok:
                failed += 1
                print(f"{name}: INVALID finish={c['finish_reason']} text={c['text'][:200]!r}")
    with urllib.request.urlopen(url + "/metrics") as r:
        m = r.read().decode()
    masks = float(re.search(r"^kaon:structured_output_masks_total\{[^}]*\} (\S+)", m, re.M).group(1))
    secs = float(re.search(r"^kaon:structured_output_mask_seconds_total\{[^}]*\} (\S+)", m, re.M).group(1))
    proc.terminate()
    proc.wait(timeout=60)
    print(f"structured on {args.device} ({Path(args.config).name}, random weights): {len(cases)} formats, {total} outputs, "
          f"{failed} invalid, {length} on length, {masks:.0f} masks, {1e6 * secs / max(masks, 1):.1f} us/mask, "
          f"{time.time() - t0:.0f} s")
    return 1 if failed or total == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
