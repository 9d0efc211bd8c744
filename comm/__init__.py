"""pyflow.comm: MPI (mpi4py) for pyflow Tensors.

``world()`` is the communicator of every rank (a world of one under plain
``python``); ``world().group([0, 2])`` a sub-group.  The module-level functions
(``all_reduce``, ``all_gather``...) run on the world, like OneFlow's
``flow.comm`` and ``torch.distributed`` without a group.  See
``communicator.py`` for the collectives and their conventions, ``p2p.py`` for
send/recv, ``work.py`` for the non-blocking handle, ``wire.py`` for what MPI
sees of a tensor, ``staging.py`` for how device memory reaches MPI,
``bucket.py`` for gradient fusion and docs/comm.md for a tour.
``PYFLOW_COMM_TIMEOUT=<seconds>`` makes a collective that waits too long raise
``CollectiveTimeoutError`` naming the ranks that did not arrive, and ranks
that call different collectives raise ``CollectiveMismatchError``
(``agreement.py``).  In a job of several ranks no fault hangs the job
(``watchdog.py``, installed by ``job.py``): an uncaught exception or a
non-zero exit on any rank aborts it, a rank that waits for one that exited
aborts it, and so does a wait longer than ``PYFLOW_COMM_STALL_TIMEOUT`` (600 s
by default), naming the ranks that did not arrive.
"""
from .agreement import CollectiveMismatchError, CollectiveTimeoutError
from .bucket import Bucket, GradBucketer
from .communicator import Communicator
from .cuda_aware import cuda_aware_mpi
from .job import world
from .staging import StagingPool, staging_pool
from .wire import REDUCE_OPS
from .work import Work

__all__ = ["Communicator", "Work", "CollectiveMismatchError", "CollectiveTimeoutError",
           "GradBucketer", "Bucket",
           "StagingPool", "staging_pool", "cuda_aware_mpi", "world", "REDUCE_OPS",
           "get_rank", "get_world_size", "all_reduce", "all_gather", "reduce_scatter",
           "all_to_all", "broadcast", "send", "recv", "barrier", "iall_reduce",
           "iall_gather", "ireduce_scatter", "iall_to_all", "ibroadcast", "isend", "irecv",
           "ibarrier"]


def get_rank():
    return world().rank


def get_world_size():
    return world().size


def _on_world(name):
    def call(*args, **kwargs):
        return getattr(world(), name)(*args, **kwargs)
    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"``world().{name}(...)``: " + (getattr(Communicator, name).__doc__ or "")
    return call


for _name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send",
              "recv", "barrier", "iall_reduce", "iall_gather", "ireduce_scatter",
              "iall_to_all", "ibroadcast", "isend", "irecv", "ibarrier"):
    globals()[_name] = _on_world(_name)
del _name
