"""Running a compiled graph: one ``Step`` per node, run in order or by actors.

A ``Step`` turns a Node into a plain Python callable over the Values it is
fed: the graph's inputs and other nodes' outputs.  State Values (parameters,
buffers) are read live from their tensors; ``const`` Values hold their folded
tensors.  A ``call`` node whose op has a backward also emits its autograd
``Context``, which the matching ``backward`` step consumes: that is how saved
activations travel from the forward to the backward, in the sequential
executor (a dict) and between actors (a register, like any other value).

``run_sequential`` walks the steps in graph order and drops every value after
its last use (the liveness from ``passes.memory``); ``lowering.py`` builds an
actor task graph from the same steps.
"""
import operator
import sys

import numpy as np

from .. import autograd, ops
from ..autograd import set_grad_enabled
from ..distributed.boxing import local_shape, run_step
from ..distributed.dispatch import (backward_pieces, forward_pieces, GlobalContext, label,
                                    replaying, run_forward)
from ..distributed.global_tensor import local_alias
from ..kernels import registry
from ..ops.shape import basic_view
from ..tensor import Tensor
from .ir import compile_substitute, iter_values, substitute
from ..distributed.sbp import broadcast, partial_sum


class Step:
    """A node made runnable: ``step(*fed_values[, ctx]) -> tuple``."""

    def __init__(self, node, graph, emits_ctx, out_meta=None):
        self.node = node
        self.kind = node.kind
        fed, seen = [], set()
        for v in node.inputs:
            if v.kind in ("input", "node") and v.id not in seen:
                seen.add(v.id)
                fed.append(v)
        self.feeds = fed                        # Values to pass in, in this order
        self.emits_ctx = emits_ctx              # a call node whose ctx a backward needs
        self.wants_ctx = node.kind == "backward"
        self.out_meta = out_meta                # backward: (shape, dtype, device) per grad
        self._index = {v.id: i for i, v in enumerate(fed)}
        self._fill_call = compile_substitute((node.args, node.kwargs), self._fetch)
        self._fill_args = compile_substitute(node.args, self._fetch)
        self.accumulate = False                 # set_grad adds into .grad (micro-batches)
        self.skip_update = False                # not the last micro-batch: no optimizer step
        self.backward_slots = ()                # eager forward: input positions to differentiate
        self.in_place = node.attrs.get("in_place")      # argument whose buffer it may take
        self.grad_sync = None                   # set_grad / update: data parallel's GradSync
        sig = node.attrs.get("signature")       # a global call: (op, placement, candidates)
        self.signature = sig[1:] if sig is not None and sig[0] is node.target else None
        self.replay = node.attrs.get("replay")  # a global node recorded whole: its ops' choices

    @property
    def name(self):
        return self.node.name

    def _fetch(self, v):
        """The function of the fed values that gives Value ``v`` (state: read live)."""
        if v.kind in ("state", "const"):
            return lambda values: v.tensor
        return operator.itemgetter(self._index[v.id])

    def _lookup(self, values):
        index = self._index

        def lookup(v):
            if v.kind in ("state", "const"):
                return v.tensor
            return values[index[v.id]]
        return lookup

    def __call__(self, *values):
        node, kind = self.node, self.kind
        if self.in_place is not None and not self.emits_ctx:
            out = self._in_place(values)
            if out is not None:
                return (out,)
        if kind == "call":
            args = self._fill_call(values)
            with set_grad_enabled(False):
                if self.signature is not None:      # on the pieces: fixed, inputs boxed
                    out, ctx = forward_pieces(node.target, args[0], args[1], *self.signature)
                else:
                    out, ctx = run_forward(node.target, args[0], args[1])
            outs = out if type(out) is tuple else (out,)
            return outs + (ctx,) if self.emits_ctx else outs
        if kind == "box":
            (x,) = self._fill_args(values)
            a = node.attrs
            piece = run_step(local_alias(x), a["placement"], a["step"])
            return (label(piece, a["placement"], a["dst"], node.outputs[0].shape),)
        if kind == "fn":
            if self.emits_ctx:
                return self._eager_forward(values)
            args = self._fill_call(values)
            with set_grad_enabled(False):
                if self.replay is not None:
                    with replaying(self.replay):
                        out = node.target(*args[0], **args[1])
                else:
                    out = node.target(*args[0], **args[1])
            return out if isinstance(out, tuple) else (out,)
        if kind == "backward":
            if node.attrs["eager"]:
                return self._eager_backward(values)
            return self._backward(values)
        if kind == "seed":
            return (node.target.draw_seed(),)
        if kind == "assign":
            (new,) = self._fill_args(values)
            t = node.target
            t._data[...] = new._data
            t._version[0] += 1
            return ()
        if kind == "set_grad":
            if "input" in node.attrs:
                return self._input_grad(values)
            (g,) = self._fill_args(values)
            p = node.target
            g = g.detach()
            sync = self.grad_sync
            if sync is not None and sync.covers(p):
                g = sync.as_partial(g, p)       # reduced later, in one bucketed all_reduce
            # (a global parameter's gradient comes in its SBP: the autograd pass boxed it)
            if self.accumulate and p.grad is not None:
                p.grad = _add_same_layout(p.grad, g)
            else:
                p.grad = _owned(g)
            if sync is not None and sync.covers(p) and not self.skip_update:
                sync.arrived(p)             # the last micro-batch: its bucket may go
            return ()
        if kind == "update":
            if self.skip_update:
                return ()
            if self.grad_sync is not None:
                self.grad_sync.flush()
            with autograd.no_grad():
                node.target()
            return ()
        raise RuntimeError(f"unknown node kind {kind!r}")

    def _input_grad(self, values):
        """The gradient of a graph input that requires grad, added to the
        ``.grad`` of the tensor passed, as eager's backward does for a leaf."""
        x, g = self._fill_args(values)
        g = g.detach()
        if x._placement is not None and g._placement is None:   # the piece, in x's SBP
            g = label(g, x._placement, x._sbp, x.shape)           # (the autograd pass boxed it)
        if x.grad is None:
            x.grad = _owned(g)
        else:
            x.grad = _add_same_layout(x.grad, g)
        return ()

    def _in_place(self, values):
        """The node's elementwise op written into its dying argument's buffer
        (passes.in_place), or None when that buffer is not safe to take."""
        node = self.node
        args = self._fill_args(values)
        x = args[self.in_place]
        if _any_global(args) or not _alone(x):     # global: the op must deduce and box
            return None
        arr = x._data
        if node.attrs["in_place_op"] == "slice_add":      # passes.slice_grad
            grad, key = args[1], args[2]
            view = basic_view(arr, key)
            view += grad._data
            x._version[0] += 1
            return Tensor._make(arr, x.dtype, x.device)
        other = args[1 - self.in_place]
        if isinstance(other, Tensor):
            if other.dtype is not x.dtype or other.device != x.device:
                return None
            other = other._data
        else:
            other = x.dtype.compute.type(other)
        a, b = (arr, other) if self.in_place == 0 else (other, arr)
        registry.get(node.attrs["in_place_op"], x.device.type)(a, b, out=arr)
        x._version[0] += 1          # a context that kept x would now refuse to use it
        return Tensor._make(arr, x.dtype, x.device)

    def _eager_forward(self, values):
        """An op recorded whole, run with eager autograd: the inputs that need a
        gradient become fresh leaves, and (outputs, leaves) is the ctx."""
        node = self.node
        slots = set(self.backward_slots)
        lookup = self._lookup(values)
        position = iter(range(1 << 62))
        leaves = []

        def leaf_or_value(v):
            t = lookup(v)
            if next(position) in slots:
                t = t.detach().requires_grad_(True)
                leaves.append(t)
            return t
        args = substitute((node.args, node.kwargs), leaf_or_value)
        with set_grad_enabled(True):
            if self.replay is not None:
                with replaying(self.replay):
                    out = node.target(*args[0], **args[1])
            else:
                out = node.target(*args[0], **args[1])
        outs = out if isinstance(out, tuple) else (out,)
        return tuple(o.detach() for o in outs) + ((outs, leaves),)

    def _eager_backward(self, values):
        outs, leaves = values[-1]
        grads = self._fill_args(values)
        pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
        res = [None] * len(leaves)
        if pairs:
            res = autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs],
                                allow_unused=True)
        out = []
        for g, v in zip(res, self.node.outputs):
            if g is None:
                g = _zeros_of(v)
            elif v.sbp is not None and g._sbp != v.sbp:
                # the layout the autograd pass declared (an op recorded whole that had
                # to box inside, in the trace, gives its gradient another one)
                g = g.to_global(sbp=v.sbp)
            out.append(g)
        return tuple(out)

    def _backward(self, values):
        node = self.node
        ctx = values[-1]
        grads = list(self._fill_args(values))
        if ctx.materialize_grads:
            grads = [g if g is not None else ops.zeros(s, dtype=d, device=dev)
                     for g, (s, d, dev) in zip(grads, self.out_meta)]
        ctx.needs_input_grad = node.attrs["needs_input_grad"]
        with set_grad_enabled(False):
            if isinstance(ctx, GlobalContext):      # the gradients come boxed (box nodes)
                res = backward_pieces(ctx, grads)
            else:
                res = node.target.backward(ctx, *grads)
        if not isinstance(res, tuple):
            res = (res,)
        out = []
        for slot, v in zip(node.attrs["slots"], node.outputs):
            g = res[slot] if slot < len(res) else None
            out.append(g if g is not None else _zeros_of(v))
        return tuple(out)


def _any_global(args):
    return any(isinstance(a, Tensor) and a._placement is not None for a in args)


def _zeros_of(v):
    """A zero gradient for Value ``v``: its piece, labelled, for a global one."""
    if v.placement is None:
        return ops.zeros(v.shape, dtype=v.dtype, device=v.device)
    piece = ops.zeros(local_shape(v.shape, v.placement, v.sbp), dtype=v.dtype, device=v.device)
    return label(piece, v.placement, v.sbp, v.shape)


def _owned(g):
    """``g``, or a copy when it views another tensor's memory (a ``.grad`` never
    aliases); a global one copies its piece (no dispatch)."""
    if g._data.base is None:
        return g
    if g._placement is None:
        return g.clone()
    return label(local_alias(g).clone(), g._placement, g._sbp, g.shape)


def _add_same_layout(a, b):
    """``a + b`` (accumulated gradients).  Two global tensors in one layout add
    their pieces: S + S, B + B and P + P keep it, with no deduction or boxing."""
    if a._placement is not None and b._placement == a._placement and b._sbp == a._sbp:
        s = local_alias(a) + local_alias(b)
        return label(s, a._placement, a._sbp, a.shape)
    return a + b


def _alone(x):
    """True when nothing but tensor ``x`` references its array and the array
    that one views (if any), and the array is a writeable, C-contiguous NumPy
    (or simulated device) array: writing into it can change no other tensor."""
    arr = x._data
    if not isinstance(arr, np.ndarray) or sys.getrefcount(arr) > _ALONE_REFS[0] \
            or not (arr.flags.writeable and arr.flags.c_contiguous):
        return False
    base = arr.base
    return base is None or (isinstance(base, np.ndarray) and base.base is None
                            and sys.getrefcount(base) <= _ALONE_REFS[1])


def _calibrate():
    """The reference counts ``_alone`` sees for an array held by one object
    only, and for the base of a view held by that view only, measured with the
    same code (CPython versions differ in the references a frame holds)."""
    class Holder:
        pass
    counts = []

    def array_refs(h):
        arr = h._data
        return sys.getrefcount(arr)

    def base_refs(h):
        arr = h._data
        base = arr.base
        return sys.getrefcount(base)
    h = Holder()
    h._data = np.empty(2)
    counts.append(array_refs(h))
    h._data = np.empty(4)[1:3]
    counts.append(base_refs(h))
    return counts


_ALONE_REFS = _calibrate()


def make_steps(graph):
    """One Step per node of ``graph``."""
    backward_of = {n.attrs["forward"]: n for n in graph.nodes if n.kind == "backward"}
    by_id = {n.id: n for n in graph.nodes}
    steps = []
    for node in graph.nodes:
        meta = None
        if node.kind == "backward":
            fwd = by_id[node.attrs["forward"]]
            meta = [(o.shape, o.dtype, o.device) for o in fwd.outputs]
        step = Step(node, graph, node.id in backward_of, meta)
        if node.id in backward_of:
            step.backward_slots = backward_of[node.id].attrs["slots"]
        steps.append(step)
    sync = GradSync.of(steps)
    for step in steps:
        if step.kind in ("set_grad", "update"):
            step.grad_sync = sync
    return steps


class GradSync:
    """Data parallel's gradient all-reduce in a graph, bucketed and overlapped.

    A replicated (broadcast) global parameter gets a partial-sum gradient from
    backward (dispatch.py's dual rule); boxing each one to broadcast would be one
    blocking all_reduce per parameter.  Instead ``set_grad`` keeps the partial
    sums in ``.grad`` and, as soon as every parameter of a bucket
    (``pyflow.comm.GradBucketer``, 25 MB) has its gradient, posts that bucket's
    non-blocking all_reduce, so it travels while backward computes the earlier
    layers' gradients; the first ``update`` step (which lowering runs after
    every ``set_grad``) waits for them all.  That is DistributedDataParallel's
    scheme, inside the graph.  Buckets are posted in index order (a bucket that
    completes early waits for its predecessors): MPI needs every rank to post
    the same collectives in the same order, and the steps of a global graph run
    in program order on every rank.  Why no separate comm-stream thread: MPI's
    non-blocking collectives already proceed without one, and a second thread
    calling MPI would need MPI_THREAD_MULTIPLE and a cross-rank order for its
    calls.  A graph without an optimizer flushes at the end of the run
    (``Plan.run``).  Only parameters broadcast on a 1-D placement are bucketed;
    the others are boxed one by one."""

    bucket_bytes = 25 * 2 ** 20      # as DistributedDataParallel's bucket_cap_mb=25

    def __init__(self, params):
        from ..comm import GradBucketer     # here, not at the top: importing MPI costs ~1 s
        by_placement = {}
        for p in params:
            by_placement.setdefault(p._placement, []).append(p)
        self.bucketers = [GradBucketer(ps, bucket_bytes=self.bucket_bytes, comm=plc.comm,
                                       average=False)
                          for plc, ps in by_placement.items()]
        self.where = {}                 # id(param) -> (bucketer index, bucket index)
        for k, b in enumerate(self.bucketers):
            for i, bucket in enumerate(b.buckets):
                for p in bucket.params:
                    self.where[id(p)] = (k, i)
        self._reset()

    def _reset(self):
        self.pending = False
        self.ready = [[0] * len(b.buckets) for b in self.bucketers]
        self.posted = [0] * len(self.bucketers)      # buckets posted, in index order

    @classmethod
    def of(cls, steps):
        params = [s.node.target for s in steps if s.kind == "set_grad"
                  and "input" not in s.node.attrs]
        params = [p for p in params if p._placement is not None and p._sbp == (broadcast,)
                  and p._placement.comm is not None]
        return cls(params) if params else None

    def covers(self, p):
        return id(p) in self.where

    def as_partial(self, g, p):
        """``p``'s gradient ``g`` as a partial sum: a local gradient is the piece of
        the dual layout (P), a broadcast one becomes P by a local zero-fill."""
        self.pending = True
        if g._placement is None:
            return label(Tensor._make(g._data, g.dtype, g.device), p._placement,
                         (partial_sum,), p.shape)
        return g if g._sbp == (partial_sum,) else g.to_global(sbp=partial_sum)

    def arrived(self, p):
        """``p.grad`` is final for this run: post every complete bucket in order."""
        k, i = self.where[id(p)]
        self.ready[k][i] += 1
        self._post(k, complete_only=True)

    def _post(self, k, complete_only):
        bucketer, ready = self.bucketers[k], self.ready[k]
        while self.posted[k] < len(bucketer.buckets):
            i = self.posted[k]
            if complete_only and ready[i] < len(bucketer.buckets[i].params):
                return
            # the final bucket completes last (buckets post in index order): nothing
            # is left to overlap it with, so a blocking all_reduce (GradBucketer)
            bucketer.start_bucket(i, blocking=i == len(bucketer.buckets) - 1)
            self.posted[k] += 1

    def flush(self):
        """Wait for every bucket (posting the incomplete ones: a parameter without
        a gradient this run contributes zeros); ``.grad`` becomes broadcast."""
        if not self.pending:
            return
        for k, bucketer in enumerate(self.bucketers):
            self._post(k, complete_only=False)
            for i, bucket in enumerate(bucketer.buckets):
                bucketer.finish_bucket(i)
                for p in bucket.params:
                    g = p.grad
                    g._placement, g._sbp, g._logical_shape = \
                        p._placement, p._sbp, p._logical_shape
        self._reset()


def run_sequential(graph, steps, inputs, release):
    """Run ``steps`` in order on ``inputs`` (tensors, one per graph input).
    ``release[i]`` lists the Value ids whose last reader is step i."""
    env = {v.id: x for v, x in zip(graph.inputs, inputs)}
    ctxs = {}
    for i, step in enumerate(steps):
        vals = [env[v.id] for v in step.feeds]
        if step.wants_ctx:
            vals.append(ctxs.pop(step.node.attrs["forward"]))
        res = step(*vals)
        if step.emits_ctx:
            ctxs[step.node.id] = res[-1]
            res = res[:-1]
        for v, r in zip(step.node.outputs, res):
            env[v.id] = r
        del vals, res               # else they would keep this step's values alive
        for vid in release[i]:      # through the next one
            env.pop(vid, None)
    return _outputs(graph, env)


def _outputs(graph, env):
    def lookup(v):
        if v.kind in ("state", "const"):
            return v.tensor
        return env[v.id]
    return substitute(graph.outputs, lookup)


__all__ = ["Step", "make_steps", "run_sequential", "iter_values"]
