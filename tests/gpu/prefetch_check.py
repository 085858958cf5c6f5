#!/usr/bin/env python3
"""Prefetches that the compiler turned into waits, from the built objects' machine code.

A kernel that keeps loads in flight across loop iterations (a rotating register file: consume
q[u], then refill it for a later iteration) can compile into a copy: the new load's registers
moved into the loop-carried ones inside the same iteration. The copy reads the load, so the
warp waits there for the load it has just issued, and what was meant to be U loads in flight
becomes about one. k_t4_gemv lost most of its bandwidth that way (tests/gpu/NOTES.md, session
49). Flagged: a global load inside an innermost loop whose first reader in that iteration is a
register move whose destination is not read again before the loop's back edge (it only
relocates the value for the next iteration). Exit 1 when there is one.

  prefetch_check.py BUILD_DIR | OBJECT.o ... | SASS.txt ...
      (needs cuobjdump for objects: $CUOBJDUMP, else on PATH / in /usr/local/cuda/bin)
"""
import re
import sys
from pathlib import Path

from sass_dump import cuda_objects, sass

INS = re.compile(r"/\*([0-9a-f]{4,6})\*/\s+([^;]+);")


def unpredicated(text):
    return re.sub(r"^@!?U?P\w+\s+", "", text)


def reads(text, regs):
    """Whether the instruction reads any of regs (its operands after the destination)."""
    parts = unpredicated(text).split(None, 1)
    if len(parts) < 2:
        return False
    srcs = " ".join(o.strip() for o in parts[1].split(",")[1:])
    return any(re.search(r"\b" + r + r"\b", srcs) for r in regs)


def innermost_loops(ins):
    """(first, last) instruction indices of each backward branch's body holding no other loop."""
    addr = [int(a, 16) for a, _ in ins]
    loops = []
    for k, (_, t) in enumerate(ins):
        m = re.match(r"BRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", unpredicated(t))
        if m and m.group(1) and int(m.group(1), 16) < addr[k]:
            lo = next(i for i in range(len(ins)) if addr[i] >= int(m.group(1), 16))
            loops.append((lo, k))
    return [l for l in loops if not any(o != l and o[0] >= l[0] and o[1] <= l[1] for o in loops)]


def relocated_loads(sass):
    """(kernel, [(load address, move address)]) for every flagged load."""
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    for name, body in zip(parts[1::2], parts[2::2]):
        ins = INS.findall(body)
        hits = []
        for lo, hi in innermost_loops(ins):
            for k in range(lo, hi + 1):
                m = re.match(r"LDG(\S*)\s+R(\d+),", unpredicated(ins[k][1]))
                if not m:
                    continue
                width = 4 if ".128" in m.group(1) else 2 if ".64" in m.group(1) else 1
                regs = [f"R{int(m.group(2)) + i}" for i in range(width)]
                j = next((j for j in range(k + 1, hi + 1) if reads(ins[j][1], regs)), None)
                if j is None:
                    continue
                mv = re.match(r"(?:IMAD\.MOV\S*\s+(R\d+),\s*RZ,\s*RZ|MOV\S*\s+(R\d+)),", unpredicated(ins[j][1]))
                if not mv:
                    continue
                dst = mv.group(1) or mv.group(2)
                if not any(reads(ins[i][1], [dst]) for i in range(j + 1, hi + 1)):
                    hits.append((ins[k][0], ins[j][0]))
        if hits:
            yield name, hits


def main():
    args = [Path(a) for a in sys.argv[1:]] or [Path("build-gpu")]
    paths = []
    for a in args:
        paths += cuda_objects(a, "prefetch_check") if a.is_dir() else [a]
    found = 0
    for p in paths:
        text = sass(p, "prefetch_check") if p.suffix == ".o" else p.read_text()
        for name, hits in relocated_loads(text):
            found += 1
            print(f"{p.name}: {name}: {len(hits)} load(s) moved within their own iteration: {hits[:3]}")
    print(f"prefetch_check: {len(paths)} objects, {found} kernel(s) with prefetches turned into waits")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
