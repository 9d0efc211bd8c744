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

The flat buffers and missing gradients are allocated by the parameters'
device backend (``pyflow/device.py``) and wrapped as tensors of the
parameters' class (``wire.new_tensor``): ``pyflow.comm`` sits below the
tensor layer and imports neither ``pyflow.tensor`` nor the creation ops.
"""
import numpy as np

from pyflow import dtypes as _dt
from pyflow.device import backend_of

from .job import world
from .wire import is_tensor, new_tensor

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
            data = backend_of(self.device).zeros((self.numel,), self.dtype.storage)
            self.flat = new_tensor(self.params[0], data)
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

    def unpack(self, scale=None):
        """Copy the reduced values into the ``.grad``s, times ``scale`` if given
        (the mean's 1/size folded into this copy instead of a pass of its own)."""
        flat = self.flat._data
        offset = 0
        for p in self.params:
            n = p.numel()
            piece = flat[offset:offset + n].reshape(p._data.shape)
            if p.grad is None:
                p.grad = new_tensor(p, backend_of(p.device).empty(tuple(p.shape), p.dtype.storage))
            if scale is None:
                p.grad._data[...] = piece
            else:
                np.multiply(piece, piece.dtype.type(scale), out=p.grad._data)
            p.grad._version[0] += 1
            offset += n

    def scales_on_unpack(self):
        """True when the mean's 1/size can ride on ``unpack``: host float32/float64
        buffers (half types are reduced in float32 by the communicator, and device
        buffers are not NumPy arrays)."""
        return self.device.type == "cpu" and self.dtype in (_dt.float32, _dt.float64)


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
            if not is_tensor(p):
                raise TypeError(f"GradBucketer: params[{i}] must be a Tensor, got "
                                f"{type(p).__name__}")
            if not p.dtype.is_floating_point:
                raise TypeError(f"GradBucketer: params[{i}] has dtype {p.dtype}; gradients "
                                f"are floating point")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("GradBucketer: a parameter is listed twice")
        if comm is None:
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

    def _op_and_scale(self, bucket):
        """(reduce op, scale for unpack): a mean is a sum scaled while unpacking
        where the bucket allows it (one pass over the buffer fewer)."""
        if not self.average:
            return "sum", None
        if bucket.scales_on_unpack():
            return "sum", 1.0 / self.comm.size
        return "avg", None

    def start_bucket(self, i, blocking=False):
        """Pack bucket ``i`` and post its all_reduce: non-blocking, or with
        ``blocking`` (when nothing is left to overlap it with) a blocking one,
        which MPI runs as its tuned collective.  Open MPI's non-blocking
        all_reduce (libnbc) took 4.7 ms for 13 MB on 2 ranks here, against
        1.8 ms blocking, and without a progress thread it advances only inside
        MPI calls anyway."""
        bucket = self.buckets[i]
        bucket.pack()
        self.collectives += 1
        op, _ = self._op_and_scale(bucket)
        if blocking:
            self.comm.all_reduce(bucket.flat, op)
            self._pending[i] = None
        else:
            self._pending[i] = self.comm.iall_reduce(bucket.flat, op)

    def finish_bucket(self, i):
        """Wait for bucket ``i``'s all_reduce and copy the results into the ``.grad``s."""
        work = self._pending.pop(i)
        if work is not None:
            work.wait()
        bucket = self.buckets[i]
        bucket.unpack(self._op_and_scale(bucket)[1])

    def reduce(self):
        """All-reduce every gradient, one collective per bucket."""
        for i in range(len(self.buckets)):
            self.start_bucket(i, blocking=True)
            self.finish_bucket(i)

    def __repr__(self):
        sizes = ", ".join(f"{b.dtype.name}/{b.device}:{len(b.params)}p/{b.nbytes}B"
                          for b in self.buckets)
        return f"GradBucketer({len(self.buckets)} buckets: {sizes})"
