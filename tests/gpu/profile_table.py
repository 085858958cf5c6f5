#!/usr/bin/env python3
"""One decode step from an ncu --csv --page raw file (tests/gpu/profile_decode.sh): the kernels
between the last two k_sample launches, in launch order, then grouped by kernel name with time,
DRAM bytes and effective bandwidth."""
import csv
import sys
from collections import OrderedDict


def num(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return 0.0


def main(path):
    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    rows = list(csv.DictReader(lines))
    if len(rows) < 2:
        print("no kernels in", path)
        return
    rows = rows[1:] if rows[0].get("ID", "").strip() == "" else rows  # the units row
    name = lambda r: r["Kernel Name"].split("(")[0].replace("void ", "")
    samples = [i for i, r in enumerate(rows) if name(r).startswith("k_sample")]
    if len(samples) >= 2:
        step = rows[samples[-2] + 1: samples[-1] + 1]
    else:
        step = rows
    print(f"{len(rows)} kernels profiled; one decode step: {len(step)} launches")
    t_all = 0.0
    groups = OrderedDict()
    for r in step:
        t = num(r["gpu__time_duration.sum"]) / 1000.0  # ns -> us
        rd = num(r["dram__bytes_read.sum"])
        wr = num(r["dram__bytes_write.sum"])
        k = f'{name(r)} [{r["launch__grid_size"]}x{r["launch__block_size"]}]'
        g = groups.setdefault(k, [0, 0.0, 0.0, 0.0])
        g[0] += 1
        g[1] += t
        g[2] += rd
        g[3] += wr
        t_all += t
    print(f"{'kernel [grid x block]':78s} {'n':>4s} {'us total':>9s} {'us each':>8s} {'MB read':>8s} {'GB/s':>7s}")
    for k, (n, t, rd, wr) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"{k[:78]:78s} {n:4d} {t:9.1f} {t / n:8.2f} {rd / 1e6:8.2f} {rd / max(t, 1e-9) / 1e3:7.0f}")
    rd_all = sum(g[2] for g in groups.values())
    print(f"sum {t_all:.1f} us, {rd_all / 1e6:.1f} MB read, {rd_all / max(t_all, 1e-9) / 1e3:.0f} GB/s")


if __name__ == "__main__":
    main(sys.argv[1])
