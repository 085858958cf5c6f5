"""Starting kaon as a multi-node job on this one machine: mpirun -np N processes (Open MPI),
each one "node" of the job (src/dist/cluster.h). More processes than cores (--oversubscribe),
no pinning to cores (--bind-to none: each process runs its own threads), and Open MPI's consent
to run as root, as CI does."""
import os
import shutil

ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def mpirun(np_, env_vars=()):
    """The launcher prefix for np_ processes; env_vars: variables every process gets (-x)."""
    exe = shutil.which("mpirun")
    assert exe, "mpirun not found: scripts/setup.sh installs openmpi-bin"
    cmd = [exe, "-np", str(np_), "--oversubscribe", "--bind-to", "none"]
    for v in env_vars:
        cmd += ["-x", v]
    return cmd


def env(extra=None):
    return {**os.environ, **ENV, **(extra or {})}
