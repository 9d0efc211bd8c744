"""SBP: how one logical tensor is laid out over the ranks of a placement.

* ``split(dim)``: rank i holds the i-th equal slice along ``dim``;
* ``broadcast``: every rank holds the whole tensor (replicas);
* ``partial_sum``: every rank holds a tensor of the full shape and the logical
  value is their sum (what a matmul split on its reduced dim produces).

Same names and reprs as OneFlow's ``oneflow.sbp`` (with ``pyflow.``), so a
printed signature reads the same.  The objects are immutable and hashable,
so they can be dict keys in SBP signature tables.
"""
__all__ = ["SbpParallel", "split", "broadcast", "partial_sum", "as_sbp_tuple"]


class SbpParallel:
    """One SBP: ``kind`` is "split", "broadcast" or "partial_sum"; ``dim`` only for split."""
    __slots__ = ("kind", "dim")

    def __init__(self, kind, dim=None):
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "dim", dim)

    def __setattr__(self, name, value):
        raise AttributeError("sbp objects are immutable")

    def __eq__(self, other):
        return isinstance(other, SbpParallel) and (self.kind, self.dim) == (other.kind, other.dim)

    def __hash__(self):
        return hash((self.kind, self.dim))

    def __repr__(self):
        return f"pyflow.sbp.split(dim={self.dim})" if self.kind == "split" \
            else f"pyflow.sbp.{self.kind}"

    def __reduce__(self):      # pickles back to the same singletons / split(dim)
        return (split, (self.dim,)) if self.kind == "split" else (_named, (self.kind,))

    @property
    def is_split(self):
        return self.kind == "split"


def split(dim):
    """``S(dim)``: rank i of the placement holds slice i of ``dim`` (equal slices)."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 0:
        raise ValueError(f"sbp.split: dim must be a non-negative int, got {dim!r}")
    return SbpParallel("split", dim)


broadcast = SbpParallel("broadcast")
partial_sum = SbpParallel("partial_sum")


def _named(kind):
    return {"broadcast": broadcast, "partial_sum": partial_sum}[kind]


def as_sbp_tuple(sbp, ndim_placement=1, fn="to_global"):
    """``sbp`` (one SBP or a list/tuple of them, one per placement dimension) as a
    tuple; a clear error for anything else."""
    items = tuple(sbp) if isinstance(sbp, (list, tuple)) else (sbp,)
    for s in items:
        if not isinstance(s, SbpParallel):
            hint = " (call it: pyflow.sbp.split(0))" if s is split else ""
            raise TypeError(f"{fn}: sbp must be pyflow.sbp.split(dim), pyflow.sbp.broadcast or "
                            f"pyflow.sbp.partial_sum (or a tuple of them), got {s!r}{hint}")
    if len(items) != ndim_placement:
        raise ValueError(f"{fn}: sbp must have one entry per placement dimension "
                         f"({ndim_placement}), got {len(items)}: {items}")
    return items
