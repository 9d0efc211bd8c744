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
back.  Split sizes must divide evenly for now (clear error otherwise).  The
collectives skip ``pyflow.comm``'s cross-rank shape check (``check=False``):
the shapes follow from the global tensor's logical shape, which every rank
agreed on when it was made, and the check would double the collectives of
every boxing (one per gradient in data parallel training).
``describe`` gives the bytes each conversion sends per rank, for ``explain``.
The functions do not record autograd: ``global_tensor.py`` wraps them in a
``Function`` (they must be handed *local* tensors: a global argument would be
dispatched as a global op).

**N-D (``box``).**  On an N-D placement the SBP is a tuple, one entry per
hierarchy axis, applied in axis order: axis 0's with this rank's coordinate
0 on the logical tensor, then axis 1's on that piece, and so on (OneFlow's
nd-sbp; ``local_shape``/``slice_piece`` spell it out).  ``box`` converts one
axis at a time with the 1-D functions over ``placement.sub_comm(axis)``.  That
is exact when no axis *inside* the converted one is split on a dim the
conversion splits or gathers (slicing other dims, summing and zero-filling
all commute with it); otherwise the piece on that inner axis is not the
slice the outer conversion thinks it is (S(0) inside S(0): axis 1's slice
of axis 0's slice).  So ``plan`` walks the axes from outer to inner and,
before converting axis i, first gathers (S -> B) every inner axis that is
split on one of axis i's src/dst split dims, innermost first; later steps
split them again if the destination wants it.  ``describe_nd`` lists the
steps with their bytes per rank.
"""
from collections import namedtuple

import pyflow

from .placement import placement as Placement
from .sbp import SbpParallel, as_sbp_tuple, broadcast, partial_sum

__all__ = ["boxing", "describe", "BoxingCost", "p_to_b", "p_to_s", "s_to_b", "s_to_s",
           "b_to_s", "b_to_p", "s_to_p", "identity", "check_divisible", "box", "plan",
           "describe_nd", "BoxingStep", "local_shape", "logical_shape_of", "slice_piece",
           "piece_offsets"]


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
    return comm.all_reduce(x.clone(), check=False)


def p_to_s(x, comm, d):
    """P -> S(d): sum, and each rank keeps its slice of d (reduce_scatter)."""
    check_divisible(x.shape, d, comm.size)
    return _back(comm.reduce_scatter(_front(x, d), check=False), d)


def s_to_b(x, comm, d):
    """S(d) -> B: concatenate every rank's slice along d (all_gather)."""
    return _back(comm.all_gather(_front(x, d), check=False), d).contiguous()


def s_to_s(x, comm, i, j):
    """S(i) -> S(j): chunk k of dim j goes to rank k, the received chunks are
    concatenated along i (all_to_all)."""
    n = comm.size
    check_divisible(x.shape, j, n)
    chunks = pyflow.stack(pyflow.chunk(x, n, dim=j))          # (n, ...): chunk k for rank k
    got = comm.all_to_all(chunks.contiguous(), check=False)                # got[k]: rank k's chunk for us
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
    (every rank of the placement calls it with the same arguments).  Also
    ``boxing(x, src_tuple, dst_tuple, placement)``: the same as ``box``."""
    if isinstance(comm, Placement):
        return box(x, comm, src, dst)
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


# ====================================================================== N-D
def _hierarchy(placement_or_hierarchy):
    h = placement_or_hierarchy.hierarchy if isinstance(placement_or_hierarchy, Placement) \
        else placement_or_hierarchy
    return tuple(int(n) for n in h)


def local_shape(logical_shape, hierarchy, sbp, coords=None, fn="local_shape"):
    """The shape of the piece at ``coords`` of a logical tensor of ``logical_shape``
    laid out as ``sbp`` (one SBP per axis of ``hierarchy``, a placement or a
    shape).  Splits apply in axis order, each on the previous axis' piece; they
    must divide evenly (a clear error otherwise), so every rank's piece has the
    same shape and ``coords`` only matters for the checks (kept in the signature
    for uneven splits)."""
    hierarchy = _hierarchy(hierarchy)
    sbp = as_sbp_tuple(sbp, len(hierarchy), fn)
    shape = list(logical_shape)
    for axis, (s, n) in enumerate(zip(sbp, hierarchy)):
        if coords is not None and not 0 <= coords[axis] < n:
            raise ValueError(f"{fn}: coords {tuple(coords)} outside hierarchy {hierarchy}")
        if s.is_split:
            if len(hierarchy) > 1 and s.dim < len(shape) and shape[s.dim] % n:
                raise ValueError(
                    f"{fn}: sbp {tuple(sbp)} on hierarchy {hierarchy}: {s!r} on axis {axis} "
                    f"needs dim {s.dim} of the piece {tuple(shape)} (after the axes before "
                    f"it) divisible by {n}; logical shape {tuple(logical_shape)} (uneven "
                    f"splits are not supported yet)")
            check_divisible(shape, s.dim, n, fn)
            shape[s.dim] //= n
    return tuple(shape)


def logical_shape_of(local_shape, hierarchy, sbp, fn="logical_shape_of"):
    """The logical shape whose pieces under ``sbp`` have ``local_shape``."""
    hierarchy = _hierarchy(hierarchy)
    sbp = as_sbp_tuple(sbp, len(hierarchy), fn)
    shape = list(local_shape)
    for s, n in zip(sbp, hierarchy):
        if s.is_split:
            if s.dim >= len(shape):
                raise ValueError(f"{fn}: {s!r} needs a tensor with more than {s.dim} dims, "
                                 f"got shape {tuple(local_shape)}")
            shape[s.dim] *= n
    return tuple(shape)


def piece_offsets(logical_shape, hierarchy, sbp, coords):
    """``[(dim, start, length)]``: the slices (in axis order) that cut the piece at
    ``coords`` out of the logical tensor."""
    hierarchy = _hierarchy(hierarchy)
    sbp = as_sbp_tuple(sbp, len(hierarchy), "piece_offsets")
    shape, out = list(logical_shape), []
    for s, n, c in zip(sbp, hierarchy, coords):
        if s.is_split:
            check_divisible(shape, s.dim, n, "piece_offsets")
            shape[s.dim] //= n
            out.append((s.dim, c * shape[s.dim], shape[s.dim]))
    return out


def slice_piece(full, hierarchy, sbp, coords):
    """The piece at ``coords`` of the logical tensor ``full`` (every rank holds it:
    broadcast on every axis) under ``sbp``, with no communication: the splits
    slice, and a partial_sum axis keeps the value at coordinate 0 and zeros
    elsewhere.  A new tensor (never a view of ``full``)."""
    hierarchy = _hierarchy(hierarchy)
    sbp = as_sbp_tuple(sbp, len(hierarchy), "slice_piece")
    if any(s == partial_sum and c != 0 for s, c in zip(sbp, coords)):
        return pyflow.zeros(local_shape(full.shape, hierarchy, sbp), dtype=full.dtype,
                            device=full.device)
    x = full
    for dim, start, length in piece_offsets(full.shape, hierarchy, sbp, coords):
        x = pyflow.narrow(x, dim, start, length)
    return x.clone()


BoxingStep = namedtuple("BoxingStep", "axis src dst op bytes")
BoxingStep.__doc__ = """One step of an N-D boxing: a 1-D conversion on hierarchy ``axis``
(over ``placement.sub_comm(axis)``), its collective and the bytes each rank sends."""


def _split_dims(*sbps):
    return {s.dim for s in sbps if s.is_split}


def plan(src, dst):
    """The 1-D conversions ``[(axis, from, to)]`` that turn nd-sbp ``src`` into
    ``dst`` (see the module docstring for why inner splits are gathered first)."""
    cur, steps = list(src), []
    for i in range(len(cur)):
        if cur[i] == dst[i]:
            continue
        touched = _split_dims(cur[i], dst[i])
        for j in reversed(range(i + 1, len(cur))):       # innermost first: each step exact
            if cur[j].is_split and cur[j].dim in touched:
                steps.append((j, cur[j], broadcast))
                cur[j] = broadcast
        steps.append((i, cur[i], dst[i]))
        cur[i] = dst[i]
    return steps


def _check_nd(fn, placement, src, dst):
    if not isinstance(placement, Placement):
        raise TypeError(f"{fn}: placement must be a pyflow.placement, got {placement!r}")
    return as_sbp_tuple(src, placement.ndim, fn), as_sbp_tuple(dst, placement.ndim, fn)


def box(x, placement, src, dst):
    """Convert this rank's piece ``x`` (a *local* pyflow Tensor) of a global tensor on
    ``placement`` from nd-sbp ``src`` to ``dst`` (tuples, one SBP per hierarchy
    axis; a single SBP for a 1-D placement); returns the new piece.  Every rank
    of the placement calls it with the same arguments; a rank outside gets ``x``
    back.  On a 1-D placement it is exactly ``boxing(x, src, dst, comm)``.
    Uneven splits raise before anything moves."""
    src, dst = _check_nd("box", placement, src, dst)
    if placement.comm is None:
        return x
    if placement.ndim == 1:
        return boxing(x, src[0], dst[0], placement.comm)
    if src == dst:
        return identity(x, placement.comm)
    logical = logical_shape_of(x.shape, placement, src, "box")
    local_shape(logical, placement, dst, fn="box")             # uneven: error before moving
    for axis, a, b in plan(src, dst):
        x = boxing(x, a, b, placement.sub_comm(axis))
    return x


def describe_nd(src, dst, shape, dtype, hierarchy):
    """The steps of ``box`` for a logical tensor of ``shape``/``dtype`` on
    ``hierarchy`` (a placement or its shape): ``[BoxingStep(axis, src, dst, op,
    bytes)]``, bytes sent per rank (``describe`` of the axis' sub-communicator,
    whose logical tensor is the piece un-split on that axis only); the sum is
    the conversion's cost.  Empty when ``src == dst``."""
    hierarchy = _hierarchy(hierarchy)
    src = as_sbp_tuple(src, len(hierarchy), "describe_nd")
    dst = as_sbp_tuple(dst, len(hierarchy), "describe_nd")
    cur, out = list(src), []
    for axis, a, b in plan(src, dst):
        around = cur[:axis] + [broadcast] + cur[axis + 1:]
        sub_shape = local_shape(shape, hierarchy, around, fn="describe_nd")
        cost = describe(a, b, sub_shape, dtype, hierarchy[axis])
        out.append(BoxingStep(axis, a, b, cost.op, cost.bytes))
        cur[axis] = b
    return out
