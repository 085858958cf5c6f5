#!/usr/bin/env python3
"""Loads a kernel issues before its PDL wait (griddepcontrol.wait, SASS ACQBULK), from the
built objects' machine code.

Under programmatic dependent launch a kernel starts while the kernel before it still runs;
before kc_pdl_wait() it may read only what no earlier kernel writes (weights). The compiler
treats loads through `const T *__restrict__` (ld.global.nc, "invariant") as free to move, and
ptxas has moved such a load of the routing's active-expert count above the wait (a race that
read the previous layer's count: tests/gpu/patches/moe-small-down-tasks.patch). Weight loads
here use ld_stream (SASS .NA) or cp.async (LDGSTS); any other global load before the wait is
printed. Exit 1 when there is one. Allowed on purpose (ALLOWED): k_moe_small_down's ld.cg
(.STRONG.GPU) reads of the routing plan under KAON_MOE_DOWN_EARLY, which the gate/up kernel makes
final before this kernel launches (cuda_moe.cu).

The other way round: the kernels in EARLY request their first weights before the wait, and
ptxas has sunk such (.nc) loads below it (cuda_ld.h), leaving each to wait a memory round trip
after the kernel before ends. Printed (and exit 1) when one has no weight load before any wait.

  pdl_check.py BUILD_DIR    (needs cuobjdump: $CUOBJDUMP, else on PATH / in /usr/local/cuda/bin)
"""
import re
import sys
from pathlib import Path

from sass_dump import cuda_objects, sass


# Kernel-name fragment -> the load form it may issue before its wait.
ALLOWED = {"k_moe_small_down": ".STRONG.GPU"}


def allowed(kernel, ins):
    return any(k in kernel and form in ins for k, form in ALLOWED.items())


# Kernel-name fragments whose source requests weights before kc_pdl_wait.
EARLY = ("k_gemv", "k_fp8_gemv", "k_t4_gemv", "k_qgemv", "k_moe_route_small", "k_moe_route_cluster",
         "k_moe_small_gu", "k_moe_small_down")
WEIGHT = re.compile(r"\bLDG\S*\.NA\b|\bLDGSTS\b")


def sunk_prefetches(sass):
    """Kernels of EARLY without a weight-style load before any of their waits."""
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    for name, body in zip(parts[1::2], parts[2::2]):
        if not any(k in name for k in EARLY):
            continue
        lines = body.splitlines()
        waits = [i for i, l in enumerate(lines) if "ACQBULK" in l]
        if waits and not any(WEIGHT.search(l) for l in lines[:waits[-1]]):
            yield name


def early_loads(sass):
    """(kernel, [loads before its first ACQBULK that are not weight-style])."""
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    for name, body in zip(parts[1::2], parts[2::2]):
        lines = body.splitlines()
        acq = next((i for i, l in enumerate(lines) if "ACQBULK" in l), None)
        if acq is None:
            continue
        ins = [l.split(";")[0].split("*/")[-1].strip() for l in lines[:acq]]
        bad = [i for i in ins if re.search(r"\bLDG\b|\bLDG\.", i) and ".NA." not in i and not allowed(name, i)]
        if bad:
            yield name, bad


def main():
    build = Path(sys.argv[1] if len(sys.argv) > 1 else "build-gpu")
    objs, found, sunk = cuda_objects(build, "pdl_check"), 0, 0
    for o in objs:
        text = sass(o, "pdl_check")
        for name, bad in early_loads(text):
            found += 1
            print(f"{o.name}: {name}: {len(bad)} load(s) before the PDL wait: {bad[:3]}")
        for name in sunk_prefetches(text):
            sunk += 1
            print(f"{o.name}: {name}: no weight load before its PDL wait (prefetch sunk below it)")
    print(f"pdl_check: {len(objs)} objects, {found} kernel(s) with loads before the wait, "
          f"{sunk} with their early weight loads sunk below it")
    return 1 if found or sunk else 0


if __name__ == "__main__":
    sys.exit(main())
