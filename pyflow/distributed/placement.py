"""``placement(type, ranks)``: the device type and the ranks a global tensor lives on.

``ranks`` is a list (1-D placement) or a nested list of any depth (N-D, for
N-D SBP): ``placement("cpu", [[0, 1], [2, 3]])`` has ``hierarchy == (2, 2)``
and one SBP per hierarchy axis.  The rank at position ``(i, j)`` holds piece
``(i, j)``: axis 0's SBP is applied first (with coordinate i), then axis 1's
on the result (coordinate j), as in OneFlow's nd-sbp.  ``ranks`` gives the
nested list back; ``flat_ranks`` the ranks in row-major order.

Communicators (``pyflow.comm``), made lazily the first time one is asked for:

* ``comm``: every rank of the placement, in row-major order (the world itself
  when that is 0..n-1);
* ``sub_comm(axis)``: the ranks that share this rank's coordinates on every
  axis but ``axis``, ordered by their coordinate on ``axis`` (what one axis
  of an N-D boxing talks over).

Making communicators is collective over the *world*, so every rank (in the
placement or not) must ask at the same point of the program; the first
request makes all of them (``comm`` and every axis) in one fixed order, so no
two ranks ever disagree on which group comes next.  They are cached per rank
layout at module level: equal placements built separately share them, and a
placement object is cheap.  Ranks outside the placement get ``None``.
Constructing a placement never starts MPI.
"""
import numpy as np

__all__ = ["placement"]

_DEVICE_TYPES = ("cpu", "cuda")
_COMMS = {}          # flat ranks, hierarchy -> (comm, [sub_comm per axis]) of this rank


def _shape_of(ranks, where="ranks"):
    """The shape of a (regular) nested list of ints; a clear error otherwise."""
    if isinstance(ranks, (list, tuple, range)):
        items = list(ranks)
        if not items:
            shown = f"{items!r}" if where == "ranks" else f"{where}={items!r}"
            raise ValueError(f"placement: ranks must be a non-empty list of distinct "
                             f"non-negative ints, got {shown}")
        inner = [_shape_of(r, f"{where}[{i}]") for i, r in enumerate(items)]
        if any(s != inner[0] for s in inner):
            raise ValueError(f"placement: a nested rank list must be rectangular (every "
                             f"row the same length), got shapes "
                             f"{[list(s) for s in inner]} in {where}")
        return (len(items),) + inner[0]
    return ()


def _flatten(ranks):
    if isinstance(ranks, (list, tuple, range)):
        return [r for item in ranks for r in _flatten(item)]
    return [ranks]


class placement:  # noqa: N801  (OneFlow's and PyTorch-style lower-case type name)
    """``pyflow.placement(type="cpu", ranks=[0, 1])`` or ``ranks=[[0, 1], [2, 3]]``."""

    def __init__(self, type, ranks):  # noqa: A002  (OneFlow's argument name)
        if type not in _DEVICE_TYPES:
            raise ValueError(f"placement: type must be one of {_DEVICE_TYPES}, got {type!r}")
        if isinstance(ranks, np.ndarray):
            ranks = ranks.tolist()
        if not isinstance(ranks, (list, tuple, range)):
            raise TypeError(f"placement: ranks must be a list of ints, got {ranks!r} (or a "
                            f"nested list of ints for an N-D placement)")
        hierarchy = _shape_of(ranks)
        flat = _flatten(ranks)
        if any(isinstance(r, bool) or not isinstance(r, (int, np.integer)) or r < 0
               for r in flat) or len(set(flat)) != len(flat):
            raise ValueError(f"placement: ranks must be a non-empty list of distinct "
                             f"non-negative ints, got {ranks!r}")
        self._type = type
        self._ranks = tuple(int(r) for r in flat)
        self._hierarchy = hierarchy

    @property
    def type(self):
        return self._type

    @property
    def ranks(self):
        """The ranks as given: a list, or a nested list for an N-D placement."""
        return np.array(self._ranks, dtype=np.int64).reshape(self._hierarchy).tolist()

    @property
    def flat_ranks(self):
        """Every rank in row-major order (the order of ``comm``)."""
        return list(self._ranks)

    @property
    def hierarchy(self):
        return self._hierarchy

    @property
    def ndim(self):
        return len(self._hierarchy)

    @property
    def size(self):
        return len(self._ranks)

    def coords(self, rank=None):
        """The position of ``rank`` (default: this process's world rank) in the
        hierarchy, a tuple with one coordinate per axis; None if it is not here."""
        if rank is None:
            from pyflow.comm import world
            rank = world().rank
        if rank not in self._ranks:
            return None
        return tuple(int(c) for c in np.unravel_index(self._ranks.index(rank), self._hierarchy))

    def __eq__(self, other):
        return isinstance(other, placement) and \
            (self._type, self._ranks, self._hierarchy) == \
            (other._type, other._ranks, other._hierarchy)

    def __hash__(self):
        return hash(("placement", self._type, self._ranks, self._hierarchy))

    def __repr__(self):
        return f'pyflow.placement(type="{self._type}", ranks={self.ranks})'

    # ------------------------------------------------------------ communicators
    @property
    def comm(self):
        """This placement's communicator, or None on a rank outside it.  The first
        request is collective over the world (every rank must make it)."""
        return self._comms()[0]

    def sub_comm(self, axis):
        """The communicator along hierarchy axis ``axis`` for this rank (the ranks
        that differ from it only on ``axis``, in coordinate order), or None on a
        rank outside the placement.  For a 1-D placement, ``sub_comm(0) is comm``."""
        if isinstance(axis, bool) or not isinstance(axis, int) or \
                not -self.ndim <= axis < self.ndim:
            raise ValueError(f"placement.sub_comm: axis must be an int in [0, {self.ndim}) "
                             f"for hierarchy {self._hierarchy}, got {axis!r}")
        return self._comms()[1][axis % self.ndim]

    def _comms(self):
        key = (self._ranks, self._hierarchy)
        if key not in _COMMS:
            from pyflow.comm import world
            w = world()
            bad = [r for r in self._ranks if r >= w.size]
            if bad:
                raise ValueError(f"placement: ranks {bad} do not exist in a world of "
                                 f"{w.size} rank(s) ({self!r})")
            whole = w if self._ranks == tuple(range(w.size)) else w.group(self._ranks)
            if self.ndim == 1:
                subs = [whole]
            else:
                # One split per axis, the same order on every rank: color = the
                # line (every coordinate but the axis'), key = the coordinate on it.
                me = self.coords(w.rank)
                subs = []
                for axis in range(self.ndim):
                    if me is None:
                        subs.append(w.split(None, 0))
                        continue
                    rest = [c for a, c in enumerate(me) if a != axis]
                    dims = [n for a, n in enumerate(self._hierarchy) if a != axis]
                    subs.append(w.split(int(np.ravel_multi_index(rest, dims)), me[axis]))
            _COMMS[key] = (whole, subs)
        return _COMMS[key]

    @classmethod
    def all(cls, type):  # noqa: A002
        """Every rank of the world (``oneflow.placement.all``)."""
        from pyflow.comm import world
        return cls(type, list(range(world().size)))
