"""The environment of the MPI jobs the tests start.

Open MPI's ofi BTL (in the pip wheel) sleeps 1 s in ``MPI_Init`` on a machine
without a fabric, then fails its init; ob1 sends through the sm and self BTLs
with it or without it.  mpi4py initializes MPI when pyflow is imported, so
leaving it out takes every process that imports pyflow from ~1.3 s to ~0.2 s
of startup: each rank, each pytest worker, each script a test runs.
``tests/conftest.py`` sets it for the test process (children inherit it);
``job_env`` keeps it in the environments cleaned of an outer MPI job, and
``launcher_args`` hands it to pyflow-run, which drops every ``OMPI_`` variable.
"""
import os

FAST_MPI_INIT = {"OMPI_MCA_btl": "^ofi"}


def job_env(drop=("OMPI_", "PMIX_", "PRTE_")):
    """``os.environ`` without the variables starting with ``drop`` (an outer MPI
    job's must not leak into a nested mpirun, as when the test process itself was
    started by mpirun), plus the fast-init setting (the test process's own value
    where it has one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update({k: os.environ.get(k, v) for k, v in FAST_MPI_INIT.items()})
    return env


def launcher_args():
    """pyflow-run's option that passes the fast-init setting to mpirun as ``--mca``."""
    mca = [f"--mca {k[len('OMPI_MCA_'):]} {os.environ.get(k, v)}"
           for k, v in FAST_MPI_INIT.items()]
    return ["--mpirun-args", " ".join(mca)]
