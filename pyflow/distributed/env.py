"""Where this process sits in the job: rank, world size, local rank.

The truth is MPI's world communicator (``pyflow.comm.world()``), so a job
started by ``pyflow-run``, ``mpirun``, ``mpiexec`` or ``srun`` (with Slurm's
PMIx) all answer the same way, and a plain ``python script.py`` is a world of
one (an MPI singleton).

The local rank (which GPU this rank drives) comes from the launcher's
environment when it says so, because that is free and exactly what the
launcher meant: Open MPI's ``OMPI_COMM_WORLD_LOCAL_RANK``, MPICH/Hydra's
``MPI_LOCALRANKID``, Slurm's ``SLURM_LOCALID``.  Without any of them it is this
rank's position among the ranks sharing its node (an MPI shared-memory split,
computed once).
"""
import os

__all__ = ["get_rank", "get_world_size", "get_local_rank", "get_local_world_size",
           "LOCAL_RANK_ENV_VARS"]

# Checked in this order: a launcher that sets its own variable wins over a Slurm
# allocation's (mpirun inside an sbatch script inherits SLURM_LOCALID=0).
LOCAL_RANK_ENV_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")

_node_comm = []


def _world():
    from pyflow.comm import world
    return world()


def get_rank():
    """This process's rank in the world, in ``[0, get_world_size())``."""
    return _world().rank


def get_world_size():
    """The number of processes in the job (1 under plain ``python``)."""
    return _world().size


def _node():
    """The ranks sharing this node (MPI shared-memory split), made once."""
    if not _node_comm:
        from mpi4py import MPI
        w = _world()
        _node_comm.append(w.mpi.Split_type(MPI.COMM_TYPE_SHARED, key=w.rank))
    return _node_comm[0]


def get_local_rank():
    """This process's rank among the ranks of its node (picks its GPU)."""
    for name in LOCAL_RANK_ENV_VARS:
        value = os.environ.get(name)
        if value is not None and value.strip().isdigit():
            return int(value)
    if get_world_size() == 1:
        return 0
    return _node().Get_rank()


def get_local_world_size():
    """The number of ranks on this node."""
    value = os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE")
    if value is not None and value.strip().isdigit():
        return int(value)
    if get_world_size() == 1:
        return 1
    return _node().Get_size()
