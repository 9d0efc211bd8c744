"""Gradient buckets (tensor fusion): one all_reduce per bucket, not per gradient.

Tiny per-tensor collectives are latency-bound; Horovod and PyTorch DDP pack
gradients into a flat buffer and reduce that.  ``GradBucketer`` groups the
parameters by (dtype, device), in the order given, into buckets of at most
``bucket_bytes`` (a parameter bigger than that gets a bucket of its own).  Each
bucket owns one flat buffer, allocated on first use and reused every step:
pack the ``.grad``s, all_reduce once, copy the results back into each
``.grad``.

A parameter without a gradient contributes zeros, and receives the reduced
gradient afterwards: every rank must run the same collectives in the same order
whatever its local graph used, and the other ranks' gradient is real.

Used by ``nn.parallel.DistributedDataParallel``, which starts a bucket
(``start_bucket``) as soon as its last gradient is ready so the reduction
overlaps the rest of backward.
"""
import numpy as np

from pyflow.tensor import Tensor

__all__ = ["GradBucketer", "Bucket"]


class Bucket:
    """Parameters of one dtype and device sharing one flat buffer."""

    def __init__(self, params):
        self.params = list(params)
        self.dtype = self.params[0].dtype
        self.device = self.params[0].device
        self.numel = sum(p.numel() for p in self.params)
        self.nbytes = self.numel * self.dtype.itemsize
        self.flat = None                   # the reused buffer, a 1-D Tensor

    def buffer(self):
        if self.flat is None:
            import pyflow
            self.flat = pyflow.zeros(self.numel, dtype=self.dtype, device=self.device)
        return self.flat

    def pack(self):
        flat = self.buffer()._data
        offset = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                flat[offset:offset + n] = 0
            else:
                flat[offset:offset + n] = p.grad._data.reshape(-1)
            offset += n

    def unpack(self):
        flat = self.flat._data
        offset = 0
        for p in self.params:
            n = p.numel()
            piece = flat[offset:offset + n].reshape(p._data.shape)
            if p.grad is None:
                import pyflow
                p.grad = pyflow.empty(tuple(p.shape), dtype=p.dtype, device=p.device)
            p.grad._data[...] = piece
            p.grad._version[0] += 1
            offset += n


class GradBucketer:
    """Fused gradient all_reduce over ``comm`` (default: the world).

    ``reduce()`` packs, reduces and unpacks every bucket (blocking);
    ``start_bucket(i)`` / ``finish_bucket(i)`` split it for overlap with backward.
    ``average=True`` divides by the communicator size (data parallel's mean over
    the global batch).  ``collectives`` counts the all_reduces issued.
    """

    def __init__(self, params, bucket_bytes=25 * 2 ** 20, comm=None, average=True):
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, (int, np.integer)) \
                or bucket_bytes <= 0:
            raise ValueError(f"GradBucketer: bucket_bytes must be a positive int, got "
                             f"{bucket_bytes!r}")
        params = list(params)
        for i, p in enumerate(params):
            if not isinstance(p, Tensor):
                raise TypeError(f"GradBucketer: params[{i}] must be a Tensor, got "
                                f"{type(p).__name__}")
            if not p.dtype.is_floating_point:
                raise TypeError(f"GradBucketer: params[{i}] has dtype {p.dtype}; gradients "
                                f"are floating point")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("GradBucketer: a parameter is listed twice")
        if comm is None:
            from .communicator import world
            comm = world()
        self.comm, self.average, self.bucket_bytes = comm, bool(average), int(bucket_bytes)
        self.buckets = self._assign(params)
        self.collectives = 0
        self._pending = {}

    def _assign(self, params):
        open_by_kind, buckets = {}, []
        for p in params:
            kind = (p.dtype, p.device)
            size = p.numel() * p.dtype.itemsize
            current = open_by_kind.get(kind)
            if current is None or current[1] + size > self.bucket_bytes:
                current = open_by_kind[kind] = [[], 0]
                buckets.append(current)
            current[0].append(p)
            current[1] += size
        return [Bucket(members) for members, _ in buckets if members]

    def start_bucket(self, i):
        """Pack bucket ``i`` and post its non-blocking all_reduce."""
        bucket = self.buckets[i]
        bucket.pack()
        self.collectives += 1
        self._pending[i] = self.comm.iall_reduce(bucket.flat, "avg" if self.average else "sum")

    def finish_bucket(self, i):
        """Wait for bucket ``i``'s all_reduce and copy the results into the ``.grad``s."""
        self._pending.pop(i).wait()
        self.buckets[i].unpack()

    def reduce(self):
        """All-reduce every gradient, one collective per bucket."""
        op = "avg" if self.average else "sum"
        for bucket in self.buckets:
            bucket.pack()
            self.collectives += 1
            self.comm.all_reduce(bucket.flat, op)
            bucket.unpack()

    def __repr__(self):
        sizes = ", ".join(f"{b.dtype.name}/{b.device}:{len(b.params)}p/{b.nbytes}B"
                          for b in self.buckets)
        return f"GradBucketer({len(self.buckets)} buckets: {sizes})"
