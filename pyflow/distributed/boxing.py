"""Eager boxing: turn the local pieces of a global tensor from one SBP into another.

**The table.**  ``CONVERSIONS`` below maps a pair of SBP kinds, ``(source,
target)`` with S = split, B = broadcast, P = partial_sum, to one
``Conversion`` row: the collective (or local step) it runs, the bytes it sends
per rank, and the small function that does it on this rank's piece.  Both
the boxing itself (``boxing``, ``box``) and its description (``describe``,
``describe_nd``, which ``explain`` and the signature deduction read) look the
row up there, so they cannot disagree.  Two equal SBPs need no row: that is
the identity (``conversion`` returns ``IDENTITY``); S(i) -> S(j) with i != j
is the ("S", "S") row.  ``docs/sbp.md`` prints the table as
``table_markdown()`` writes it (a test compares them).

Each run function works on this rank's piece ``x`` (a pyflow Tensor) and the
placement's communicator ``comm`` (size n, this rank r); the logical value
never changes, only how it is laid out.  The collectives of ``pyflow.comm``
work on dim 0, so a conversion on dim d moves d to the front (``movedim`` +
``contiguous``: a copy when d != 0) and back.  Split sizes must divide evenly
for now (clear error otherwise).  The collectives skip ``pyflow.comm``'s
cross-rank shape check (``check=False``): the shapes follow from the global
tensor's logical shape, which every rank agreed on when it was made, and the
check would double the collectives of every boxing (one per gradient in data
parallel training).  The functions do not record autograd:
``global_tensor.py`` wraps them in a ``Function`` (they must be handed *local*
tensors: a global argument would be dispatched as a global op).

**N-D (``box``).**  On an N-D placement the SBP is a tuple, one entry per
hierarchy axis, applied in axis order: axis 0's with this rank's coordinate
0 on the logical tensor, then axis 1's on that piece, and so on (OneFlow's
nd-sbp; ``local_shape``/``slice_piece`` spell it out).  ``box`` converts one
axis at a time with the 1-D conversions over ``placement.sub_comm(axis)``.  That
is exact when no axis *inside* the converted one is split on a dim the
conversion splits or gathers (slicing other dims, summing and zero-filling
all commute with it); otherwise the piece on that inner axis is not the
slice the outer conversion thinks it is (S(0) inside S(0): axis 1's slice
of axis 0's slice).  So ``plan`` walks the axes from outer to inner and,
before converting axis i, first gathers (S -> B) every inner axis that is
split on one of axis i's src/dst split dims, innermost first; later steps
split them again if the destination wants it.  ``describe_nd`` lists the
steps with their collective and bytes per rank from shapes alone (no
Tensor), and ``run_step`` runs one of them: a compiled graph can plan its
boxing once and insert one node per step.
"""
from collections import namedtuple

from pyflow.ops import cat, chunk, movedim, narrow, stack, zeros, zeros_like

from .placement import placement as Placement
from .sbp import SbpParallel, as_sbp_tuple, broadcast, partial_sum

__all__ = ["boxing", "describe", "BoxingCost", "p_to_b", "p_to_s", "s_to_b", "s_to_s",
           "b_to_s", "b_to_p", "s_to_p", "identity", "check_divisible", "box", "plan",
           "describe_nd", "BoxingStep", "local_shape", "logical_shape_of", "slice_piece",
           "piece_offsets", "Conversion", "CONVERSIONS", "IDENTITY", "conversion", "kind_of",
           "run_step", "wire_bytes", "table_markdown"]


def check_divisible(shape, dim, n, fn="boxing"):
    """Raise unless ``shape[dim]`` exists and splits into ``n`` equal pieces."""
    if dim >= len(shape):
        raise ValueError(f"{fn}: split(dim={dim}) needs a tensor with more than {dim} dims, "
                         f"got shape {tuple(shape)}")
    if shape[dim] % n:
        raise ValueError(f"{fn}: split(dim={dim}) over {n} ranks needs dim {dim} divisible "
                         f"by {n}, got shape {tuple(shape)} (uneven splits are not supported "
                         f"yet)")


# ====================================================================== the conversions
def _front(x, d):
    """``x`` with dim d moved to the front, contiguous (what MPI is handed)."""
    return (x if d == 0 else movedim(x, d, 0)).contiguous()


def _back(x, d):
    return x if d == 0 else movedim(x, 0, d)


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
    chunks = stack(chunk(x, n, dim=j))                        # (n, ...): chunk k for rank k
    got = comm.all_to_all(chunks.contiguous(), check=False)   # got[k]: rank k's chunk for us
    return cat([got[k] for k in range(n)], dim=i)


def b_to_s(x, comm, d):
    """B -> S(d): keep this rank's slice (no communication)."""
    n = comm.size
    check_divisible(x.shape, d, n)
    size = x.shape[d] // n
    return narrow(x, d, comm.rank * size, size).clone()


def b_to_p(x, comm):
    """B -> P: rank 0 keeps the value, the others hold zeros (sum = the value)."""
    return x.clone() if comm.rank == 0 else zeros_like(x)


def s_to_p(x, comm, d):
    """S(d) -> P: the logical shape, zeros except this rank's slice."""
    z = zeros_like(x)
    return cat([x if k == comm.rank else z for k in range(comm.size)], dim=d)


# ====================================================================== bytes per rank
# What each rank sends with the usual ring algorithms, for a logical tensor of
# T bytes on n ranks.  The docstring is the formula ``table_markdown`` prints.
def _ring_all_reduce_bytes(T, n):
    """2(n-1)/n T"""
    return 2 * T * (n - 1) // n


def _ring_bytes(T, n):
    """(n-1)/n T"""
    return T * (n - 1) // n


def _all_to_all_bytes(T, n):
    """(n-1)/n^2 T"""
    return T * (n - 1) // (n * n)


def _no_bytes(T, n):
    """0"""
    return 0


# ====================================================================== the table
Conversion = namedtuple("Conversion", "src dst collective bytes run")
Conversion.__doc__ = """One row of the boxing table: SBP kind ``src`` -> ``dst`` ("S", "B" or
"P"), the ``collective`` it runs ("all_reduce"... or a local step, which sends
nothing), ``bytes(T, n)``: bytes each of n ranks sends for a logical tensor of T
bytes (on the wire: see ``wire_bytes``), and ``run(x, comm, src_sbp, dst_sbp)``:
this rank's new piece."""

CONVERSIONS = {row[:2]: row for row in [
    Conversion("P", "B", "all_reduce", _ring_all_reduce_bytes,
               lambda x, comm, a, b: p_to_b(x, comm)),
    Conversion("P", "S", "reduce_scatter", _ring_bytes,
               lambda x, comm, a, b: p_to_s(x, comm, b.dim)),
    Conversion("S", "B", "all_gather", _ring_bytes,
               lambda x, comm, a, b: s_to_b(x, comm, a.dim)),
    Conversion("S", "S", "all_to_all", _all_to_all_bytes,         # S(i) -> S(j), i != j
               lambda x, comm, a, b: s_to_s(x, comm, a.dim, b.dim)),
    Conversion("B", "S", "local_slice", _no_bytes,
               lambda x, comm, a, b: b_to_s(x, comm, b.dim)),
    Conversion("B", "P", "local_zero_fill", _no_bytes,             # rank 0 keeps the value
               lambda x, comm, a, b: b_to_p(x, comm)),
    Conversion("S", "P", "local_zero_fill", _no_bytes,             # zeros around the slice
               lambda x, comm, a, b: s_to_p(x, comm, a.dim)),
]}

# Equal SBPs (B -> B, P -> P, S(d) -> S(d)): nothing to do.
IDENTITY = Conversion("=", "=", "identity", _no_bytes, lambda x, comm, a, b: identity(x, comm))

_KINDS = {"split": "S", "broadcast": "B", "partial_sum": "P"}


def kind_of(sbp):
    """The table's key for one SBP: "S" (any split dim), "B" or "P"."""
    return _KINDS[sbp.kind]


def conversion(src, dst):
    """The table row that turns SBP ``src`` into ``dst`` (``IDENTITY`` when equal)."""
    return IDENTITY if src == dst else CONVERSIONS[kind_of(src), kind_of(dst)]


def wire_bytes(shape, dtype, src=None):
    """T for ``Conversion.bytes``: the logical size of ``shape``/``dtype`` in bytes as
    it travels.  Out of partial_sum the collective sums, and float16/bfloat16
    sums travel as float32 (see ``pyflow.comm``), which doubles their bytes."""
    numel = 1
    for s in shape:
        numel *= int(s)
    half_float = dtype.itemsize == 2 and dtype.is_floating_point
    return numel * (4 if src == partial_sum and half_float else dtype.itemsize)


def table_markdown():
    """The table as the Markdown that ``docs/sbp.md`` prints (a test compares them)."""
    lines = ["| from | to | collective | bytes sent per rank (T: logical bytes, n: ranks) |",
             "|---|---|---|---|"]
    for row in CONVERSIONS.values():
        lines.append(f"| {row.src} | {row.dst} | {row.collective} | {row.bytes.__doc__} |")
    return "\n".join(lines) + "\n"


# ====================================================================== 1-D boxing
def boxing(x, src, dst, comm):
    """Convert the local piece ``x`` from SBP ``src`` to ``dst`` over ``comm``
    (every rank of the placement calls it with the same arguments).  Also
    ``boxing(x, src_tuple, dst_tuple, placement)``: the same as ``box``."""
    if isinstance(comm, Placement):
        return box(x, comm, src, dst)
    for name, s in (("src", src), ("dst", dst)):
        if not isinstance(s, SbpParallel):
            raise TypeError(f"boxing: {name} must be an sbp (pyflow.sbp.*), got {s!r}")
    return conversion(src, dst).run(x, comm, src, dst)


BoxingCost = namedtuple("BoxingCost", "op bytes")
BoxingCost.__doc__ = """One conversion: the collective (or local step) and the bytes each
rank sends with the usual ring algorithms."""


def describe(src, dst, shape, dtype, n):
    """What ``src -> dst`` costs on ``n`` ranks for a logical tensor of ``shape`` and
    ``dtype``: ``BoxingCost(op, bytes)``, the table row's collective and bytes sent
    per rank (ring all_reduce 2(n-1)/n T, reduce_scatter and all_gather (n-1)/n T,
    all_to_all (n-1)/n^2 T, T the logical size in bytes (``wire_bytes``); local
    steps 0).  On one rank every conversion is the identity."""
    if n == 1:
        return BoxingCost("identity", 0)
    row = conversion(src, dst)
    return BoxingCost(row.collective, row.bytes(wire_bytes(shape, dtype, src), n))


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
        return zeros(local_shape(full.shape, hierarchy, sbp), dtype=full.dtype,
                            device=full.device)
    x = full
    for dim, start, length in piece_offsets(full.shape, hierarchy, sbp, coords):
        x = narrow(x, dim, start, length)
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
    for step in plan(src, dst):
        x = run_step(x, placement, step)
    return x


def run_step(x, placement, step):
    """Run one step of a plan (``(axis, src, dst)``, or a ``BoxingStep`` of
    ``describe_nd``) on this rank's piece ``x``: the table's conversion over
    ``placement.sub_comm(axis)``; returns the new piece.  Every rank of the
    placement calls it with the same step; a rank outside gets ``x`` back."""
    if placement.comm is None:
        return x
    axis, a, b = step[:3]
    return conversion(a, b).run(x, placement.sub_comm(axis), a, b)


def describe_nd(src, dst, shape, dtype, hierarchy):
    """The boxing of a logical tensor from nd-sbp ``src`` to ``dst``, from shapes alone
    (no Tensor, no communicator: a compile-time pass can call it).

    ``src``, ``dst``: tuples of SBPs, one per placement axis (a single SBP for a
    1-D placement); ``shape``: the logical shape; ``dtype``: a pyflow dtype;
    ``hierarchy``: a placement or its axis sizes (``(4,)``, ``(2, 2)``).
    Returns ``[BoxingStep(axis, src, dst, op, bytes)]`` in the order ``box`` runs
    them (``plan``): the 1-D conversion on hierarchy ``axis``, its collective
    (the table's ``collective``) and the bytes each rank sends (``describe`` on
    the axis' sub-communicator, whose logical tensor is the piece un-split on
    that axis only); the sum is the conversion's cost.  Empty when ``src ==
    dst``.  ``run_step(x, placement, step)`` runs one step."""
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
