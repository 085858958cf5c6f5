"""The SASS of built CUDA objects, for the checks that read machine code (pdl_check.py,
prefetch_check.py): cuobjdump from $CUOBJDUMP, PATH or /usr/local/cuda/bin."""
import os
import shutil
import subprocess
import sys
from pathlib import Path


def cuobjdump(tool):
    for c in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), "/usr/local/cuda/bin/cuobjdump"):
        if c and Path(c).exists():
            return c
    sys.exit(f"{tool}: no cuobjdump (set CUOBJDUMP)")


def cuda_objects(build, tool):
    """The backend's CUDA objects under a build folder (exits when there are none)."""
    objs = sorted(Path(build).glob("**/backend/cuda/*.cu.o"))
    if not objs:
        sys.exit(f"{tool}: no CUDA objects under {build}")
    return objs


def sass(obj, tool):
    return subprocess.run([cuobjdump(tool), "-sass", str(obj)], capture_output=True, text=True).stdout
