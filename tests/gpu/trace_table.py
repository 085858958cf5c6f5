#!/usr/bin/env python3
"""Per-step kernel times from tests/gpu/kernel_trace.c's CSV.

Steps end at each k_sample kernel, or before each k_step_mark where the run marked its steps
(KAON_TRACE_MARK=1); the last STEPS whole steps are averaged (with TRACE_TOKENS=N, the last STEPS
marked steps of N tokens). A kernel's
exclusive time is what it adds to the stream's busy time (from the later of its start and
the previous kernel's end, to its end): with PDL a kernel starts early and waits, and that
wait is the previous kernel's time, not its own. Idle is the step's wall time no kernel ran.
STEPS 0 shows one step instead, the one that ends at the K-th k_sample (1-based; K 1, the
first step, is a run's prefill).

  trace_table.py TRACE.csv [STEPS [K]]
"""
import collections
import os
import sys


def short(name):
    depth = 0
    for i, ch in enumerate(name):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            return name[:i]
    return name


def load(path):
    ks = []
    for line in open(path):
        f = line.rstrip("\n").split(",", 7)
        if len(f) < 8:
            continue
        ks.append((int(f[0]), int(f[1]), f"{short(f[7])} [{int(f[3]) * int(f[4]) * int(f[5])}x{f[6]}]"))
    ks.sort()
    return ks


def main():
    ks = load(sys.argv[1])
    want = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    # Steps end at each k_sample, or, where the run marked its steps (KAON_TRACE_MARK=1: an empty
    # k_step_mark kernel starts each step; batched steps do not launch one k_sample each), before each mark.
    marks = [i for i, k in enumerate(ks) if k[2].startswith("k_step_mark") and i > 0]
    ends = [i - 1 for i in marks] if len(marks) > 1 else \
        [i for i, k in enumerate(ks) if k[2].startswith("k_sample")]
    # TRACE_TOKENS=N (marked runs; the mark's grid is the step's token count): only the steps of N
    # tokens, e.g. the decode-only steps where all N sequences of a batch decode together.
    size = int(os.environ.get("TRACE_TOKENS", "0"))
    if size and len(marks) > 1:
        pairs = [(a, b) for a, b, m in zip(ends, ends[1:], marks) if ks[m][2].endswith(f"[{size}x1]")]
        pairs = pairs[-want:] if want else pairs
        if not pairs:
            sys.exit(f"no marked step of {size} tokens")
    else:
        pairs = None
    if want == 0:
        k = int(sys.argv[3]) if len(sys.argv) > 3 else 1
        if not 1 <= k <= len(ends):
            sys.exit(f"no k_sample number {k}")
        ks.insert(0, (ks[0][0], ks[0][0], "start"))  # a zero-length mark before the first kernel
        ends = [0 if k == 1 else ends[k - 2] + 1, ends[k - 1] + 1]
    elif len(ends) < 2:
        sys.exit("fewer than two k_sample kernels: no whole step")
    if pairs is None:
        ends = ends[-(want + 1):] if want else ends
        pairs = list(zip(ends, ends[1:]))
    steps = len(pairs)
    excl = collections.defaultdict(float)
    count = collections.Counter()
    # A kernel launched twice a layer for two matrices (o_proj and down share k_gemv's residual
    # form and grid): its exclusive time by the parity of its launch within the step.
    alt = collections.defaultdict(lambda: [0.0, 0.0, 0, 0])  # time, time, launches, launches
    wall = busy = turn = 0.0
    for a, b in pairs:
        # The host's turnaround: from the end of the step's last kernel before it (the sampling,
        # whose ids the host waits for) to the start of the next kernel (the next step's first).
        if a + 1 < len(ks):
            turn += max(0, ks[a + 1][0] - ks[a][1]) / 1e3
        wall += (ks[b][1] - ks[a][1]) / 1e3
        prev_end = ks[a][1]
        nth = collections.Counter()
        for s, e, name in ks[a + 1:b + 1]:
            t = max(0, e - max(s, prev_end)) / 1e3
            prev_end = max(prev_end, e)
            excl[name] += t
            busy += t
            count[name] += 1
            alt[name][nth[name] % 2] += t
            alt[name][2 + nth[name] % 2] += 1
            nth[name] += 1
    print(f"{steps} steps; per step: wall {wall / steps:.1f} us, kernels {busy / steps:.1f} us, "
          f"idle {(wall - busy) / steps:.1f} us, {sum(count.values()) / steps:.0f} launches; "
          f"between steps {turn / steps:.1f} us")
    print(f"{'kernel [blocks x threads]':<72} {'n':>4} {'us/step':>9} {'us each':>8} {'share':>6}")
    for name, t in sorted(excl.items(), key=lambda kv: -kv[1]):
        n = count[name] / steps
        print(f"{name[:72]:<72} {n:>4.0f} {t / steps:>9.1f} {t / steps / n:>8.2f} {100 * t / wall:>5.1f}%")
        ev, od, ne, no = alt[name]
        if no and abs(ev / ne - od / no) > 0.1 * (ev / ne + od / no) / 2:
            print(f"{'  (its 1st, 3rd, ... launches / its 2nd, 4th, ... in a step: us each)':<72} "
                  f"{ne / steps:>4.0f} {'':>9} {ev / ne:>8.2f} / {od / no:.2f} ({no / steps:.0f})")


if __name__ == "__main__":
    main()
