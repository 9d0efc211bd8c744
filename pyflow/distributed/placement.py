"""``placement(type, ranks)``: the device type and the ranks a global tensor lives on.

The order of ``ranks`` is the order of the pieces: with ``split(d)`` the rank
at position i holds slice i.  A placement knows its ``pyflow.comm``
communicator (the world when ``ranks`` is 0..n-1 in order, else
``world().group(ranks)``); making a group is collective over the world, so it
happens lazily, the first time ``comm`` is asked for, on every rank (ranks
outside the placement get ``None``).  Constructing a placement never starts MPI.

1-D rank lists only for now; a nested (2-D) list raises NotImplementedError.
"""
__all__ = ["placement"]

_DEVICE_TYPES = ("cpu", "cuda")


class placement:  # noqa: N801  (OneFlow's and PyTorch-style lower-case type name)
    """``pyflow.placement(type="cpu", ranks=[0, 1])``."""

    def __init__(self, type, ranks):  # noqa: A002  (OneFlow's argument name)
        if type not in _DEVICE_TYPES:
            raise ValueError(f"placement: type must be one of {_DEVICE_TYPES}, got {type!r}")
        if isinstance(ranks, range):
            ranks = list(ranks)
        if not isinstance(ranks, (list, tuple)):
            raise TypeError(f"placement: ranks must be a list of ints, got {ranks!r}")
        if any(isinstance(r, (list, tuple, range)) for r in ranks):
            raise NotImplementedError(
                f"placement: 2-D rank arrays (nested lists, for 2-D SBP) are not supported yet, "
                f"got ranks={ranks!r}; use a flat list such as [0, 1, 2, 3]")
        if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or r < 0
                            for r in ranks) or len(set(ranks)) != len(ranks):
            raise ValueError(f"placement: ranks must be a non-empty list of distinct "
                             f"non-negative ints, got {ranks!r}")
        self._type = type
        self._ranks = tuple(int(r) for r in ranks)
        self._comm = []         # [communicator or None], filled on first use

    @property
    def type(self):
        return self._type

    @property
    def ranks(self):
        return list(self._ranks)

    @property
    def hierarchy(self):
        return (len(self._ranks),)

    @property
    def size(self):
        return len(self._ranks)

    def __eq__(self, other):
        return isinstance(other, placement) and (self._type, self._ranks) == \
            (other._type, other._ranks)

    def __hash__(self):
        return hash(("placement", self._type, self._ranks))

    def __repr__(self):
        return f'pyflow.placement(type="{self._type}", ranks={list(self._ranks)})'

    @property
    def comm(self):
        """This placement's communicator, or None on a rank outside it.  The first
        call is collective over the world (every rank must make it)."""
        if not self._comm:
            from pyflow.comm import world
            w = world()
            bad = [r for r in self._ranks if r >= w.size]
            if bad:
                raise ValueError(f"placement: ranks {bad} do not exist in a world of "
                                 f"{w.size} rank(s) ({self!r})")
            whole = self._ranks == tuple(range(w.size))
            self._comm.append(w if whole else w.group(self._ranks))
        return self._comm[0]

    @classmethod
    def all(cls, type):  # noqa: A002
        """Every rank of the world (``oneflow.placement.all``)."""
        from pyflow.comm import world
        return cls(type, list(range(world().size)))
