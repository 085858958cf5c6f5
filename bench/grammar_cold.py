"""Cold grammar masks over the 200-schema outputs (issue 21's bar: <= 50 us per mask).

Each finished output of `bench/structured_outputs.py --modes t0 --outputs OUTS` is replayed
offline with its own schema's grammar (the server's conversion: strict, no free whitespace)
through `bench_grammar_mask --pairs`, a fresh masker per output (its cache cold), the best of
--reps runs. Prints the mean cold us per mask (per output and weighted by masks) and the worst
outputs.

    python3 bench/structured_outputs.py --modes t0 --outputs /tmp/outs.jsonl   # once (~3 min)
    python3 bench/grammar_cold.py --outputs /tmp/outs.jsonl --gguf models/SmolLM2-135M-Instruct.Q4_1.gguf
    python3 bench/grammar_cold.py --outputs /tmp/outs.jsonl --tokenizer-json /tmp/l3tok/.../tokenizer.json
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))
import schemas200  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--outputs", required=True, help="JSONL of structured_outputs.py --outputs")
    ap.add_argument("--mode", default="t0")
    voc = ap.add_mutually_exclusive_group(required=True)
    voc.add_argument("--gguf")
    voc.add_argument("--tokenizer-json")
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--bench", help="bench_grammar_mask to run (default: the one in --build)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--worst", type=int, default=8)
    ap.add_argument("--json", help="write the per-output figures here")
    ap.add_argument("--dump", help="write every cold mask's hash here (compare two builds' files)")
    args = ap.parse_args()
    build = pathlib.Path(args.build)
    schemas = {it["name"]: it["schema"] for it in schemas200.make_schemas(200)}
    outs = [json.loads(line) for line in open(args.outputs)]
    outs = [o for o in outs if o["mode"] == args.mode and o["finish"] == "stop"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        pairs = []
        for o in outs:
            name = f"{o['schema']}_{o['index']}"
            sp = tmp / f"{name}.schema.json"
            sp.write_text(json.dumps(schemas[o["schema"]]))
            r = subprocess.run([str(build / "tests" / "json_schema_check"), "gbnf", str(sp), "--strict"],
                               capture_output=True, text=True, check=True)
            (tmp / f"{name}.gbnf").write_text(r.stdout)
            (tmp / f"{name}.txt").write_text(o["text"])
            pairs.append(f"{tmp / name}.gbnf {tmp / name}.txt")
        (tmp / "pairs").write_text("\n".join(pairs) + "\n")
        vocab = ["--gguf", args.gguf] if args.gguf else ["--tokenizer-json", args.tokenizer_json]
        r = subprocess.run([args.bench or str(build / "bench" / "bench_grammar_mask"), *vocab, "--pairs", str(tmp / "pairs"),
                            "--reps", str(args.reps), *(["--dump", args.dump] if args.dump else [])],
                           capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"bench_grammar_mask failed:\n{r.stderr[-4000:]}")
    rows = []
    for line in r.stdout.splitlines():
        _, us, masks, path = line.split()
        rows.append({"output": pathlib.Path(path).stem, "us": float(us), "masks": int(masks)})
    n = len(rows)
    mean = sum(x["us"] for x in rows) / n
    weighted = sum(x["us"] * x["masks"] for x in rows) / sum(x["masks"] for x in rows)
    print(f"{n} outputs ({args.mode}, finished), {sum(x['masks'] for x in rows)} masks, cold pass best of {args.reps}")
    print(f"mean cold us/mask: {mean:.1f} per output, {weighted:.1f} weighted by masks")
    for x in sorted(rows, key=lambda x: -x["us"])[:args.worst]:
        print(f"  {x['output']:16s} {x['us']:8.1f} us/mask  ({x['masks']} masks)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
