"""Eager boxing: turn the local pieces of a global tensor from one SBP into another.

Each conversion is one small function on this rank's piece ``x`` (a pyflow
Tensor) and the placement's communicator ``comm`` (size n, this rank r); the
logical value never changes, only how it is laid out:

=============  ==========================================================
P  -> B        all_reduce (sum)
P  -> S(d)     reduce_scatter along d
S(d) -> B      all_gather along d (d != 0: pieces are moved to the front)
S(i) -> S(j)   all_to_all
B  -> S(d)     local slice, nothing moves
B  -> P        rank 0 keeps the value, the others hold zeros
S(d) -> P      zeros of the logical shape with this rank's slice filled in
same -> same   identity
=============  ==========================================================

The collectives of ``pyflow.comm`` work on dim 0, so a conversion on dim d
moves d to the front (``movedim`` + ``contiguous``: a copy when d != 0) and
back.  Split sizes must divide evenly for now (clear error otherwise).
``describe`` gives the bytes each conversion sends per rank, for ``explain``.
The functions do not record autograd: ``global_tensor.py`` wraps them in a
``Function`` whose backward is the reverse conversion.
"""
from collections import namedtuple

import pyflow

from .sbp import SbpParallel, broadcast, partial_sum

__all__ = ["boxing", "describe", "BoxingCost", "p_to_b", "p_to_s", "s_to_b", "s_to_s",
           "b_to_s", "b_to_p", "s_to_p", "identity", "check_divisible"]


def check_divisible(shape, dim, n, fn="boxing"):
    """Raise unless ``shape[dim]`` exists and splits into ``n`` equal pieces."""
    if dim >= len(shape):
        raise ValueError(f"{fn}: split(dim={dim}) needs a tensor with more than {dim} dims, "
                         f"got shape {tuple(shape)}")
    if shape[dim] % n:
        raise ValueError(f"{fn}: split(dim={dim}) over {n} ranks needs dim {dim} divisible "
                         f"by {n}, got shape {tuple(shape)} (uneven splits are not supported "
                         f"yet)")


def _front(x, d):
    """``x`` with dim d moved to the front, contiguous (what MPI is handed)."""
    return (x if d == 0 else pyflow.movedim(x, d, 0)).contiguous()


def _back(x, d):
    return x if d == 0 else pyflow.movedim(x, 0, d)


def identity(x, comm):
    """Same SBP: a new tensor object over the same data."""
    return x.detach()


def p_to_b(x, comm):
    """P -> B: sum the partial values on every rank (all_reduce)."""
    return comm.all_reduce(x.clone())


def p_to_s(x, comm, d):
    """P -> S(d): sum, and each rank keeps its slice of d (reduce_scatter)."""
    check_divisible(x.shape, d, comm.size)
    return _back(comm.reduce_scatter(_front(x, d)), d)


def s_to_b(x, comm, d):
    """S(d) -> B: concatenate every rank's slice along d (all_gather)."""
    return _back(comm.all_gather(_front(x, d)), d).contiguous()


def s_to_s(x, comm, i, j):
    """S(i) -> S(j): chunk k of dim j goes to rank k, the received chunks are
    concatenated along i (all_to_all)."""
    n = comm.size
    check_divisible(x.shape, j, n)
    chunks = pyflow.stack(pyflow.chunk(x, n, dim=j))          # (n, ...): chunk k for rank k
    got = comm.all_to_all(chunks.contiguous())                # got[k]: rank k's chunk for us
    return pyflow.cat([got[k] for k in range(n)], dim=i)


def b_to_s(x, comm, d):
    """B -> S(d): keep this rank's slice (no communication)."""
    n = comm.size
    check_divisible(x.shape, d, n)
    size = x.shape[d] // n
    return pyflow.narrow(x, d, comm.rank * size, size).clone()


def b_to_p(x, comm):
    """B -> P: rank 0 keeps the value, the others hold zeros (sum = the value)."""
    return x.clone() if comm.rank == 0 else pyflow.zeros_like(x)


def s_to_p(x, comm, d):
    """S(d) -> P: the logical shape, zeros except this rank's slice."""
    zeros = pyflow.zeros_like(x)
    return pyflow.cat([x if k == comm.rank else zeros for k in range(comm.size)], dim=d)


def boxing(x, src, dst, comm):
    """Convert the local piece ``x`` from SBP ``src`` to ``dst`` over ``comm``
    (every rank of the placement calls it with the same arguments)."""
    for name, s in (("src", src), ("dst", dst)):
        if not isinstance(s, SbpParallel):
            raise TypeError(f"boxing: {name} must be an sbp (pyflow.sbp.*), got {s!r}")
    if src == dst:
        return identity(x, comm)
    if src.is_split and dst.is_split:
        return s_to_s(x, comm, src.dim, dst.dim)
    if src.is_split:
        return s_to_b(x, comm, src.dim) if dst == broadcast else s_to_p(x, comm, src.dim)
    if src == partial_sum:
        return p_to_b(x, comm) if dst == broadcast else p_to_s(x, comm, dst.dim)
    return b_to_p(x, comm) if dst == partial_sum else b_to_s(x, comm, dst.dim)   # src is B


BoxingCost = namedtuple("BoxingCost", "op bytes")
BoxingCost.__doc__ = """One conversion: the collective (or local step) and the bytes each
rank sends with the usual ring algorithms."""


def describe(src, dst, shape, dtype, n):
    """What ``src -> dst`` costs on ``n`` ranks for a logical tensor of ``shape`` and
    ``dtype``: ``BoxingCost(op, bytes)``, bytes sent per rank (ring all_reduce
    2(n-1)/n T, reduce_scatter and all_gather (n-1)/n T, all_to_all (n-1)/n^2 T,
    T the logical size in bytes; local steps 0).  float16/bfloat16 reductions
    travel as float32 (see ``pyflow.comm``), which doubles their bytes."""
    numel = 1
    for s in shape:
        numel *= int(s)
    total = numel * dtype.itemsize
    reduce_total = numel * 4 if dtype.itemsize == 2 and dtype.is_floating_point else total
    if src == dst or n == 1:
        return BoxingCost("identity", 0)
    if src.is_split and dst.is_split:
        return BoxingCost("all_to_all", total * (n - 1) // (n * n))
    if src.is_split:
        return BoxingCost("all_gather", total * (n - 1) // n) if dst == broadcast \
            else BoxingCost("local_zero_fill", 0)
    if src == partial_sum:
        return BoxingCost("all_reduce", 2 * reduce_total * (n - 1) // n) if dst == broadcast \
            else BoxingCost("reduce_scatter", reduce_total * (n - 1) // n)
    return BoxingCost("local_zero_fill", 0) if dst == partial_sum \
        else BoxingCost("local_slice", 0)
