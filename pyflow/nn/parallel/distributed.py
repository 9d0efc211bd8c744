"""``DistributedDataParallel``: data parallel training over ``pyflow.comm``.

Every rank holds a full replica of the module and runs forward and backward on
its own slice of the global batch; the gradients are then averaged over the
ranks, so after ``optimizer.step()`` every replica holds the same weights, the
weights single-process training on the whole global batch would give (with a
mean loss).  At construction rank 0's parameters and buffers are broadcast so
the replicas start equal; with ``broadcast_buffers`` the buffers (BatchNorm's
running statistics) are broadcast again at each forward, as in PyTorch.

**Overlap with backward.**  The parameters are grouped into buckets of at most
``bucket_cap_mb`` (``pyflow.comm.GradBucketer``), in reverse registration
order since backward produces the last layers' gradients first.  Each
parameter carries a gradient hook.  pyflow's engine calls a leaf's hooks
*before* adding the gradient into ``.grad`` (``autograd._accumulate``) and has
neither a post-accumulate hook nor an end-of-backward callback, so:

* a hook counts its bucket's ready parameters; when the bucket is complete its
  non-blocking all_reduce is posted at once (``GradBucketer.start_bucket``).
  The parameter whose hook completes the bucket has not been accumulated yet,
  so its ``.grad`` is swapped for the value it is about to have
  (``.grad + g``) while the bucket is packed;
* buckets are posted in index order on every rank (a bucket that completes
  early waits for its predecessors), because MPI needs every rank to post the
  same collectives in the same order, whatever order backward ran in;
* the hook of the last parameter to become ready is the end of backward for
  this module: it waits for every bucket, copies the averages into the
  ``.grad``s (``finish_bucket``), and returns a zero gradient for its own
  parameter, whose ``.grad`` already holds the average;
* the final bucket can only complete there, so its all_reduce is a blocking
  one (MPI's tuned collective: 1.8 ms for 13 MB on 2 ranks here, against
  4.7 ms for Open MPI's non-blocking one), and the mean's 1/size is applied
  while copying back (``Bucket.unpack``), not in a pass of its own;
* in a world of one the local gradient is the average: no bucket is packed.

An autograd change would make this simpler and cheaper: a
``Tensor.register_post_accumulate_grad_hook`` (called after ``_accumulate``
updated ``.grad``) removes the swap, and an engine ``queue_callback`` run at
the end of ``_run_backward`` would let DDP wait there, which is also what
``find_unused_parameters`` needs.

Limits (PyTorch's defaults): every parameter that requires grad must receive
a gradient in each backward (otherwise the next forward raises, naming the
parameters that got none); ``no_sync()`` skips the reduction for gradient
accumulation; double backward (``create_graph=True``) is not supported.
"""
import contextlib
import weakref

from ..module import Module

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(Module):
    def __init__(self, module, comm=None, bucket_cap_mb=25, broadcast_buffers=True):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DistributedDataParallel: module must be a pyflow.nn.Module, got "
                            f"{type(module).__name__}")
        if isinstance(bucket_cap_mb, bool) or not isinstance(bucket_cap_mb, (int, float)) \
                or not bucket_cap_mb > 0:
            raise ValueError(f"DistributedDataParallel: bucket_cap_mb must be a positive number, "
                             f"got {bucket_cap_mb!r}")
        from pyflow import autograd
        from pyflow.comm import GradBucketer, world
        self.module = module
        self.comm = world() if comm is None else comm
        self.broadcast_buffers = bool(broadcast_buffers)
        self._sync = True
        params = [p for p in module.parameters() if p.requires_grad]
        with autograd.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                self.comm.broadcast(t, 0)
        self.bucketer = GradBucketer(list(reversed(params)),
                                     bucket_bytes=max(1, int(bucket_cap_mb * 2 ** 20)),
                                     comm=self.comm, average=True)
        self._bucket_of = {}
        for i, bucket in enumerate(self.bucketer.buckets):
            for p in bucket.params:
                self._bucket_of[id(p)] = i
        self._names = {id(p): name for name, p in module.named_parameters()}
        self._n_params = len(params)
        self._reset()
        me = weakref.ref(self)           # the hooks must not keep a dropped wrapper alive
        for p in params:
            p.register_hook(_make_hook(me, p))

    def _reset(self):
        self._ready = [0] * len(self.bucketer.buckets)   # ready params per bucket
        self._seen = set()                               # ids of params whose grad came
        self._next = 0                                   # next bucket to post

    # ---------------------------------------------------------------- forward
    def forward(self, *args, **kwargs):
        if self._seen:
            missing = [name for name, p in self.module.named_parameters()
                       if id(p) in self._bucket_of and id(p) not in self._seen]
            self._reset()
            raise RuntimeError(
                f"DistributedDataParallel: the previous backward did not produce gradients "
                f"for parameters {missing}, so their gradients were never averaged; every "
                f"parameter that requires grad must take part in the loss (or set "
                f"requires_grad=False before wrapping the module)")
        if self.broadcast_buffers and self.comm.size > 1:
            from pyflow import autograd
            with autograd.no_grad():
                for b in self.module.buffers():
                    self.comm.broadcast(b, 0)
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward inside this context only accumulates local gradients (for
        gradient accumulation); the first backward outside it averages the sum."""
        prev, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = prev

    # ---------------------------------------------------------------- backward
    def _on_grad(self, p, g):
        if not self._sync or tuple(g.shape) != tuple(p.shape):
            return None          # a wrong shape: let autograd raise its own error
        if id(p) in self._seen:
            raise RuntimeError(f"DistributedDataParallel: parameter "
                               f"{self._names.get(id(p), '?')} received a second gradient in "
                               f"one backward pass")
        from pyflow import autograd
        self._seen.add(id(p))
        last = len(self._seen) == self._n_params
        if self.comm.size == 1:     # a world of one: the local gradient is the average
            if last:
                self._reset()
            return None
        i = self._bucket_of[id(p)]
        self._ready[i] += 1
        buckets = self.bucketer.buckets
        if self._ready[i] == len(buckets[i].params) and i == self._next:
            with autograd.no_grad():
                value = g.detach() if p.grad is None else p.grad + g
                if value.dtype != p.dtype:
                    value = value.to(p.dtype)
            accumulated, p.grad = p.grad, value      # what .grad is about to be
            try:
                while self._next < len(buckets) and \
                        self._ready[self._next] == len(buckets[self._next].params):
                    # The final bucket is only ever complete at the end of backward (the
                    # buckets post in index order), so nothing is left to overlap it
                    # with: blocking.  The same choice on every rank, as MPI needs.
                    final = self._next == len(buckets) - 1
                    self.bucketer.start_bucket(self._next, blocking=final)
                    self._next += 1
            finally:
                p.grad = accumulated
        if not last:
            return None
        # The last gradient of this backward: wait for every bucket, store the averages.
        for j in range(len(buckets)):
            self.bucketer.finish_bucket(j)
        self._reset()
        from pyflow import ops
        return ops.zeros_like(g)     # p.grad already holds the average: add nothing

    def extra_repr(self):
        return f"world_size={self.comm.size}, buckets={len(self.bucketer.buckets)}"


def _make_hook(ddp_ref, p):
    p_ref = weakref.ref(p)

    def ddp_grad_hook(g):
        ddp, param = ddp_ref(), p_ref()
        if ddp is None or param is None:
            return None
        return ddp._on_grad(param, g)
    return ddp_grad_hook
