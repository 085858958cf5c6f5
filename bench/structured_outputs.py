#!/usr/bin/env python3
"""Structured outputs at scale (issue 21's acceptance): the 200 JSON Schemas of
tests/e2e/schemas200.py sent as `response_format` json_schema (strict) to `kaon serve` on the
default model through the official openai client, in three modes -- temperature 0, temperature 1.0,
and temperature 1.0 with n = 3 -- with max_tokens 512. Every output that finishes (finish_reason
"stop") must parse and validate (`jsonschema`); outputs cut by max_tokens are counted and listed
(the bar: at most 2%). The server's own counters (/metrics) give the time spent in token masks per
masked token.

    python3 bench/structured_outputs.py                  # starts build/kaon serve (KAON_BUILD)
    python3 bench/structured_outputs.py --url http://127.0.0.1:8000 --schemas 50

Prints a table and writes the figures to bench/results/structured-<date>.json. Exit status 1 when
an output that finished does not validate, or more than 2% of the outputs end on length.
"""
import argparse
import concurrent.futures as cf
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))
import schemas200  # noqa: E402

MODES = [("t0", {"temperature": 0.0}), ("t1", {"temperature": 1.0}),
         ("t1_n3", {"temperature": 1.0, "n": 3})]


def start_server(threads):
    exe = pathlib.Path(os.environ.get("KAON_BUILD", REPO / "build")) / "kaon"
    model = REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    tmp = tempfile.mkdtemp(prefix="kaon-structured-")
    port_file = pathlib.Path(tmp) / "port"
    log = open(pathlib.Path(tmp) / "server.log", "wb")
    cmd = [str(exe), "serve", str(model), "--port", "0", "--port-file", str(port_file),
           "--served-model-name", "smol", "--max-model-len", "2048"]
    if threads:
        cmd += ["--threads", str(threads)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"kaon serve did not start; see {log.name}")
        time.sleep(0.05)
    host, port = port_file.read_text().split()
    url = f"http://{host}:{port}"
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"kaon serve did not become healthy; see {log.name}")
        time.sleep(0.1)
    return proc, url, log.name


def mask_counters(url):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    def get(name):
        m = re.search(rf"^{name}{{[^}}]*}} ([0-9.eE+-]+)$", text, re.M)
        return float(m.group(1)) if m else 0.0
    return get("kaon:structured_output_masks_total"), get("kaon:structured_output_mask_seconds_total")


def prompt_of(item, schema_in_prompt):
    """The request's user message: the item's prompt, and with --schema-in-prompt the schema as
    JSON after it (what vLLM's and Ollama's structured-output docs advise, and how
    JSONSchemaBench prompts: the grammar then holds the model to what it was told)."""
    if not schema_in_prompt:
        return item["prompt"]
    return f"{item['prompt']} Reply with JSON that follows this schema:\n{json.dumps(item['schema'])}"


def one(client, item, mode_kw, seed, schema_in_prompt=False):
    import jsonschema
    fmt = {"type": "json_schema",
           "json_schema": {"name": item["name"], "schema": item["schema"], "strict": True}}
    t0 = time.time()
    r = client.chat.completions.create(
        model="smol", messages=[{"role": "user", "content": prompt_of(item, schema_in_prompt)}],
        response_format=fmt, max_tokens=512, seed=seed, **mode_kw)
    out = []
    for c in r.choices:
        res = {"finish": c.finish_reason, "chars": len(c.message.content or ""), "index": c.index,
               "content": c.message.content or ""}
        if c.finish_reason == "stop":
            try:
                jsonschema.validate(json.loads(c.message.content), item["schema"])
                res["valid"] = True
            except Exception as e:  # noqa: BLE001 -- any failure is a finding
                res["valid"] = False
                res["error"] = f"{type(e).__name__}: {str(e)[:200]}"
                res["text"] = c.message.content[:400]
        else:
            res["text"] = (c.message.content or "")[-200:]
        out.append(res)
    return out, r.usage.completion_tokens, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="a running server (default: start one)")
    ap.add_argument("--schemas", type=int, default=200)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="kaon serve --threads (0: its default)")
    ap.add_argument("--modes", default="t0,t1,t1_n3")
    ap.add_argument("--json", default=None)
    ap.add_argument("--schema-in-prompt", action="store_true",
                    help="append each schema (as JSON) to its prompt; the figures name the prompt form")
    ap.add_argument("--outputs", default=None,
                    help="also write every output (mode, schema, index, finish, text) to this JSONL file, "
                         "sorted, to compare runs (temperature 0 must not change)")
    args = ap.parse_args()
    import openai
    proc = None
    url = args.url
    if not url:
        proc, url, log = start_server(args.threads)
        print(f"server: {url} (log {log})")
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=900)
    items = schemas200.make_schemas(args.schemas)
    report = {"date": datetime.date.today().isoformat(), "schemas": len(items),
              "prompt": "schema in prompt" if args.schema_in_prompt else "description only", "modes": {}}
    all_outputs = []
    bad = 0
    total_outputs = total_length = 0
    try:
        for name, kw in MODES:
            if name not in args.modes.split(","):
                continue
            m0, s0 = mask_counters(url)
            t0 = time.time()
            results, tokens = [], 0
            with cf.ThreadPoolExecutor(args.clients) as ex:
                futs = {ex.submit(one, client, it, kw, 1000 + i, args.schema_in_prompt): it
                        for i, it in enumerate(items)}
                for f in cf.as_completed(futs):
                    outs, toks, _ = f.result()
                    tokens += toks
                    results += [{"schema": futs[f]["name"], **o} for o in outs]
            wall = time.time() - t0
            m1, s1 = mask_counters(url)
            all_outputs += [(name, r["schema"], r["index"], r["finish"], r["content"]) for r in results]
            for r in results:
                del r["content"]
            n = len(results)
            stop = [r for r in results if r["finish"] == "stop"]
            invalid = [r for r in stop if not r["valid"]]
            length = [r for r in results if r["finish"] == "length"]
            other = [r for r in results if r["finish"] not in ("stop", "length")]
            masks = m1 - m0
            us = (s1 - s0) / masks * 1e6 if masks else 0.0
            report["modes"][name] = {
                "outputs": n, "stop": len(stop), "valid": len(stop) - len(invalid),
                "invalid": invalid, "length": len(length),
                "length_schemas": sorted({r["schema"] for r in length}), "other": other,
                "completion_tokens": tokens, "wall_s": round(wall, 1),
                "masks": int(masks), "mask_us_per_token": round(us, 2)}
            print(f"{name:6s} outputs {n:4d}  stop {len(stop):4d}  valid {len(stop) - len(invalid):4d}"
                  f"  invalid {len(invalid):2d}  length {len(length):3d} ({100 * len(length) / n:.1f}%)"
                  f"  other {len(other)}  tokens {tokens}  {wall:.0f} s  mask {us:.1f} us/token")
            for r in invalid[:5]:
                print("  INVALID", r["schema"], r.get("error"), r.get("text"))
            for r in length[:10]:
                print("  LENGTH ", r["schema"], repr(r["text"][-80:]))
            bad += len(invalid) + len(other)
            total_outputs += n
            total_length += len(length)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=60)
    share = total_length / total_outputs if total_outputs else 0
    report["length_share"] = share
    print(f"all modes: {total_outputs} outputs, {bad} invalid or failed, {total_length} on length "
          f"({100 * share:.2f}%; bar 2%)")
    if args.outputs:
        with open(args.outputs, "w") as f:
            for mode, schema, index, finish, text in sorted(all_outputs):
                f.write(json.dumps({"mode": mode, "schema": schema, "index": index, "finish": finish,
                                    "text": text}) + "\n")
    path = pathlib.Path(args.json or REPO / "bench" / "results" /
                        f"structured-{datetime.datetime.now():%Y%m%d-%H%M%S}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    print(f"wrote {path}")
    return 1 if bad or share > 0.02 else 0


if __name__ == "__main__":
    sys.exit(main())
