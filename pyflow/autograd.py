"""Reverse-mode autograd: a tape of Nodes, walked backwards.

Every differentiable op is a ``Function`` with ``forward`` and ``backward``
side by side (micrograd style).  ``Function.apply`` runs ``forward`` with
grad recording off and, when an input requires grad, attaches a ``Node`` to
the outputs.  Backward rules are written with pyflow ops, so they are
differentiable themselves (``create_graph=True`` gives higher derivatives).

Users subclass ``Function`` the same way to wrap their own kernels::

    class Square(pyflow.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x
        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * x * grad
"""
import functools
import threading
import weakref

import numpy as np

from . import dtypes as _dt
from ._hooks import HOOKS
from ._hooks import _state as _trace
from .kernels.registry import get as _kernel
from .tensor import Tensor, host_tensor

__all__ = ["Function", "backward", "grad", "no_grad", "enable_grad",
           "set_grad_enabled", "is_grad_enabled", "autocast_op"]

_new = object.__new__           # (objects made on every recorded op skip __init__)
_wref = weakref.ref


# ---------------------------------------------------------------- grad mode
class _GradMode(threading.local):
    enabled = True


_mode = _GradMode()
# The calling thread's grad mode, ``GRAD_MODE.enabled``: ops' fast paths read it
# instead of calling is_grad_enabled() (a call costs more than the read).
GRAD_MODE = _mode


def is_grad_enabled():
    return _mode.enabled


class set_grad_enabled:
    """Context manager / function that sets grad recording on or off."""

    def __init__(self, mode=True):
        self.prev = _mode.enabled
        _mode.enabled = bool(mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _mode.enabled = self.prev

    def __call__(self, fn):  # usable as a decorator
        mode = _mode.enabled
        _mode.enabled = self.prev

        @functools.wraps(fn)
        def wrapper(*a, **k):
            with set_grad_enabled(mode):
                return fn(*a, **k)
        return wrapper


class no_grad(set_grad_enabled):
    def __init__(self):
        self.prev = _mode.enabled

    def __enter__(self):
        self.prev = _mode.enabled
        _mode.enabled = False
        return self

    def __call__(self, fn):

        @functools.wraps(fn)
        def wrapper(*a, **k):
            with no_grad():
                return fn(*a, **k)
        return wrapper


class enable_grad(no_grad):
    def __enter__(self):
        self.prev = _mode.enabled
        _mode.enabled = True
        return self

    def __call__(self, fn):

        @functools.wraps(fn)
        def wrapper(*a, **k):
            with enable_grad():
                return fn(*a, **k)
        return wrapper


# ---------------------------------------------------------------- autocast mode
class _AutocastMode(threading.local):
    """The calling thread's autocast state, set by ``pyflow.amp.autocast``.

    It lives here, beside grad mode, because the ops read it and autograd is
    the layer every op imports (a module of its own at the top of the package
    would be a layer above the ops).  ``enabled`` is the one flag the ops test
    (true while autocast is on for some device type and not switched off
    inside an op that autocast already cast for); the rest is read only when
    it is set."""
    enabled = False
    cpu = False                 # on for CPU tensors
    cuda = False                # on for CUDA tensors
    cpu_dtype = _dt.bfloat16    # the lower-precision dtype of each device type
    cuda_dtype = _dt.float16
    cache = True                # accepted, unused: pyflow keeps no cast cache


AUTOCAST = _AutocastMode()
AUTOCAST_POLICIES = ("lower", "fp32")
_ELIGIBLE = (_dt.float32, _dt.float16, _dt.bfloat16)     # float64 is never cast (as torch)


def _autocast_device(args, kwargs):
    """The device type of the first floating point tensor among the arguments."""
    for a in args:
        if isinstance(a, Tensor) and a.dtype.category == 2:
            return a.device.type
    for a in kwargs.values():
        if isinstance(a, Tensor) and a.dtype.category == 2:
            return a.device.type
    return None


def autocast_run(policy, fn, args, kwargs):
    """``fn(*args, **kwargs)`` under autocast: its float16/bfloat16/float32 tensor
    arguments cast to the device's lower-precision dtype (``"lower"``) or to
    float32 (``"fp32"``) by the differentiable cast (so gradients come back in
    each argument's own dtype), and ``fn`` run with autocast off, as PyTorch
    runs an op after its autocast wrapper: the ops inside a composite op do
    not cast again.  Policy None runs ``fn`` as it is, autocast off inside."""
    mode = AUTOCAST
    device = _autocast_device(args, kwargs)
    if device is None or not getattr(mode, device, False):
        return fn(*args, **kwargs)
    if policy is not None:
        to = _dt.float32 if policy == "fp32" else getattr(mode, device + "_dtype")
        cast = HOOKS.cast
        args = tuple(cast(a, to) if isinstance(a, Tensor) and a.dtype is not to
                     and a.dtype in _ELIGIBLE and a.device.type == device else a for a in args)
        kwargs = {k: cast(a, to) if isinstance(a, Tensor) and a.dtype is not to
                  and a.dtype in _ELIGIBLE and a.device.type == device else a
                  for k, a in kwargs.items()}
    mode.enabled = False
    try:
        return fn(*args, **kwargs)
    finally:
        mode.enabled = True


def autocast_op(policy):
    """Decorator of a public op made of other ops (``addmm``, ``mse_loss``): the
    autocast ``policy`` of the whole op ("lower", "fp32", or None: run as
    is, its inner ops not cast, as ``mv`` in PyTorch).  A Function declares
    its policy as the class attribute ``autocast`` instead.  With autocast off
    it costs one call and one flag test."""
    if policy is not None and policy not in AUTOCAST_POLICIES:
        raise ValueError(f"autocast_op(): policy must be one of {AUTOCAST_POLICIES} or None, "
                         f"got {policy!r}")

    def decorate(fn):
        @functools.wraps(fn)
        def op(*args, **kwargs):
            if AUTOCAST.enabled:
                return autocast_run(policy, fn, args, kwargs)
            return fn(*args, **kwargs)
        op.autocast = policy
        return op
    return decorate


# ---------------------------------------------------------------- the tape
class Context:
    """What ``forward`` leaves for ``backward``."""

    # Class-level defaults: creating a Context costs nothing on the hot path.
    _saved = ()
    needs_input_grad = ()
    non_differentiable = ()
    materialize_grads = True
    _outputs = ()           # (saved index, output index) of saved outputs (_unlink_outputs)
    _node = None            # then a weak reference to the Node of this call

    def save_for_backward(self, *tensors):
        # Remember each tensor's version: an in-place change before backward
        # would silently corrupt the gradient, so backward checks it.  (A loop,
        # not a generator: this runs in every recorded op.)
        if len(tensors) == 1:
            t = tensors[0]
            self._saved = ((t, t._version[0]) if t is not None else (None, 0),)
            return
        saved = []
        for t in tensors:
            saved.append((t, t._version[0]) if t is not None else (None, 0))
        self._saved = tuple(saved)

    @property
    def saved_tensors(self):
        if self._saved is None:
            raise RuntimeError(
                "Trying to backward through the graph a second time (or to read saved "
                "tensors after they were freed); pass retain_graph=True to the first "
                "backward() if you need to backward twice.")
        out = []
        for i, (t, version) in enumerate(self._saved):
            if t is not None and t._version[0] != version:
                raise RuntimeError(
                    f"one of the tensors needed for gradient computation has been modified "
                    f"by an inplace operation: saved tensor {i} of shape {tuple(t.shape)} is at "
                    f"version {t._version[0]}; expected version {version} instead.")
            out.append(t)
        if self._outputs:
            node = self._node()
            if node is not None:        # a saved output comes back as an output of node
                for i, j in self._outputs:
                    t = out[i] = _alias(out[i])
                    t.requires_grad, t.grad_fn, t._out_idx = True, node, j
        return tuple(out)

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tensors

    def set_materialize_grads(self, value):
        self.materialize_grads = bool(value)


class Node:
    """One recorded call of a Function: ``grad_fn`` of its outputs."""
    __slots__ = ("fn", "ctx", "edges", "out_meta", "hooks", "__weakref__")

    def __init__(self, fn, ctx, edges, out_meta):
        self.hooks = None         # {output index: [hook]}
        self.fn = fn              # the Function subclass
        self.ctx = ctx
        self.edges = edges        # per input: (Node, output index[, the leaf]) or None
        self.out_meta = out_meta  # per output: (shape, dtype, device) for zero grads

    def name(self):
        return self.fn.__name__ + "Backward"

    def __repr__(self):
        return f"<{self.name()}>"

    @property
    def next_functions(self):
        return tuple(e if e is None else e[:2] for e in self.edges)

    def apply(self, grads):
        ctx = self.ctx
        if ctx._saved is None and ctx.needs_input_grad is None:
            raise RuntimeError("Trying to backward through the graph a second time; "
                               "pass retain_graph=True to the first backward().")
        if ctx.materialize_grads:
            for g in grads:
                if g is None:       # (tested first: most calls have every gradient)
                    grads = [g if g is not None else HOOKS.zeros(s, dtype=d, device=dev)
                             for g, (s, d, dev) in zip(grads, self.out_meta)]
                    break
        res = self.fn.backward(ctx, *grads)
        if not isinstance(res, tuple):
            res = (res,)
        return res

    def release(self):
        self.ctx._saved = None
        self.ctx.needs_input_grad = None


class AccumulateGrad:
    """Sink of a leaf tensor: adds the incoming gradient into ``tensor.grad``.

    One per leaf, made on the leaf's first use in a recorded op and kept by the
    leaf (``t._accumulator``) for its life, so a graph costs no new node per
    leaf.  It refers to the leaf weakly: a strong reference back would make a
    cycle that only the cyclic garbage collector frees (graph mode makes fresh
    leaves of activations every step, and such cycles once kept about 27 MB of
    ResNet-50 activations a step alive until a collection ran).  The leaf stays
    alive while a graph uses it all the same, as in PyTorch: the edges to its
    node carry the leaf itself (``_input_edge``)."""
    __slots__ = ("_tensor", "__weakref__")
    edges = ()

    def __init__(self, tensor):
        self._tensor = weakref.ref(tensor)

    @property
    def tensor(self):
        return self._tensor()

    def name(self):
        return "AccumulateGrad"

    def __repr__(self):
        return "<AccumulateGrad>"

    next_functions = ()


def _input_edge(t):
    """The edge to ``t``, a tensor that requires grad: (its grad_fn, its output
    index), or for a leaf (its AccumulateGrad, 0, the leaf): the third item keeps
    the leaf alive while the graph is (the node refers to it weakly)."""
    fn = t.grad_fn
    if fn is not None:
        return (fn, t._out_idx)
    acc = t._accumulator
    if acc is None:
        acc = t._accumulator = _new(AccumulateGrad)
        acc._tensor = _wref(t)
    return (acc, 0, t)


def _edge(t):
    if t.grad_fn is not None or t.requires_grad:
        return _input_edge(t)
    return None


class Function:
    """Base class of every differentiable op (built-in and user-defined).

    An op is one class: ``forward``, ``backward`` and ``sbp_rule``, the layouts
    of global tensors it can compute on locally (as OneFlow keeps an op's SBP
    signature beside its shape inference).  ``sbp_rule(args) -> [Candidate]``
    is built with ``pyflow.distributed.signatures`` (``elementwise_rule()``,
    ``matmul_rule``...); without one an op runs on replicated inputs
    (``broadcast_only``), always correct and only not the cheapest.

    A call with a global tensor argument goes to the SBP dispatch
    (``HOOKS.apply_global``: deduce a signature, box the inputs, run on the
    pieces) unless the class sets ``handles_global``."""
    handles_global = False
    sbp_rule = None
    # Autocast policy (docs/amp.md): "lower" runs in the device's lower-precision
    # dtype, "fp32" in float32, None in its inputs' dtypes.  A class that sets
    # it gets ``_autocast_apply`` as its ``apply``: a check inside
    # ``Function.apply`` would not see build()'s ops, since the graph tracer
    # replaces that method while it traces; this way the casts are ops the
    # trace records, and the other ops pay nothing.
    autocast = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        policy = cls.__dict__.get("autocast")
        if policy is not None:
            if policy not in AUTOCAST_POLICIES:
                raise ValueError(f"{cls.__name__}.autocast must be one of "
                                 f"{AUTOCAST_POLICIES} or None, got {policy!r}")
            cls.apply = classmethod(_autocast_apply)

    @staticmethod
    def forward(ctx, *args, **kwargs):
        raise NotImplementedError("a Function subclass must define forward(ctx, ...)")

    @staticmethod
    def backward(ctx, *grads):
        raise NotImplementedError("a Function subclass must define backward(ctx, *grads)")

    @classmethod
    def apply(cls, *args, **kwargs):
        record = False
        for a in args:
            if isinstance(a, Tensor):
                if a._placement is not None and not cls.handles_global:
                    return HOOKS.apply_global(cls, args, kwargs)
                if a.requires_grad:
                    record = True
        ctx = Context()
        mode = _mode
        if not mode.enabled:
            return cls.forward(ctx, *args, **kwargs)
        mode.enabled = False
        try:
            out = cls.forward(ctx, *args, **kwargs)
        finally:
            mode.enabled = True
        if record:
            _attach(cls, ctx, args, out)
        return out


_FUNCTION = vars(Function)     # read at call time: the tracer patches Function.apply


def _autocast_apply(cls, *args, **kwargs):
    """``apply`` of a Function with an autocast policy: one flag test, then
    ``Function.apply`` (whichever is installed: the tracer's while tracing)."""
    if AUTOCAST.enabled and cls.autocast is not None:
        return autocast_run(cls.autocast, _FUNCTION["apply"].__func__.__get__(cls), args, kwargs)
    return _FUNCTION["apply"].__func__(cls, *args, **kwargs)


def _attach(cls, ctx, args, out):
    """Record one call: a Node that is the grad_fn of every differentiable output.

    Also called, as ``record``, by ops that run a Function's forward work
    themselves (their fast paths, pyflow/ops/_util.py ``local``): ``ctx`` then
    holds what ``cls.forward`` would have left, and the op has checked what
    ``apply`` checks (grad mode on, no global argument, no graph trace)."""
    n = len(args)
    if n == 2:                      # one or two inputs, the most common: no lists
        a, b = args
        ea = _input_edge(a) if isinstance(a, Tensor) and a.requires_grad else None
        eb = _input_edge(b) if isinstance(b, Tensor) and b.requires_grad else None
        edges = (ea, eb)
        ctx.needs_input_grad = _NEEDS[ea is not None][eb is not None]
    elif n == 1:
        a = args[0]
        ea = _input_edge(a) if isinstance(a, Tensor) and a.requires_grad else None
        edges = (ea,)
        ctx.needs_input_grad = _NEEDS[ea is not None][2]
    elif n == 3:                    # linear (x, weight, bias), where (cond, a, b)
        a, b, c = args
        ea = _input_edge(a) if isinstance(a, Tensor) and a.requires_grad else None
        eb = _input_edge(b) if isinstance(b, Tensor) and b.requires_grad else None
        ec = _input_edge(c) if isinstance(c, Tensor) and c.requires_grad else None
        edges = (ea, eb, ec)
        ctx.needs_input_grad = (ea is not None, eb is not None, ec is not None)
    else:
        needs, edges = [], []
        for a in args:
            if isinstance(a, Tensor) and a.requires_grad:
                needs.append(True)
                edges.append(_input_edge(a))
            else:
                needs.append(False)
                edges.append(None)
        ctx.needs_input_grad = tuple(needs)
        edges = tuple(edges)
    # Node.__init__'s work inline: one Node per recorded op
    node = _new(Node)
    node.hooks = None
    node.fn, node.ctx, node.edges = cls, ctx, edges
    if type(out) is tuple:
        node.out_meta = tuple([(o._data.shape, o.dtype, o.device) for o in out])
        nondiff = ctx.non_differentiable
        for i, o in enumerate(out):
            if o.dtype.is_floating_point and not any(o is n for n in nondiff):
                o.requires_grad, o.grad_fn, o._out_idx = True, node, i
        if ctx._saved:
            _unlink_outputs(ctx, node, out)
        return out
    node.out_meta = ((out._data.shape, out.dtype, out.device),)
    if out.dtype.category == 2 and not ctx.non_differentiable:
        out.requires_grad = True
        out.grad_fn = node
    saved = ctx._saved
    if saved:
        for t, _ in saved:          # only a forward that saved its output has work there
            if t is out:
                _unlink_outputs(ctx, node, out)
                break
    return out


# edges and needs_input_grad of a call whose first argument is the one input that
# requires grad and whose n - 1 others are not tensors (view's shape, sum's dims)
_PAD = tuple((None,) * k for k in range(8))
_NEEDS_FIRST = tuple((True,) + (False,) * k for k in range(8))


def record_unary(cls, ctx, x, out, nargs=1):
    """``record(cls, ctx, (x, *others), out)`` for the ops' fast paths with one
    input ``x``, that requires grad, and ``nargs - 1`` other arguments that are
    not tensors; ``out`` is one tensor and ``ctx`` marks nothing non-differentiable.
    The same node as ``record`` makes, without its loop over the arguments (most
    of what recording a view or a reduction costs)."""
    fn = x.grad_fn
    if fn is not None:
        edge = (fn, x._out_idx)
    else:
        acc = x._accumulator
        if acc is None:
            acc = x._accumulator = _new(AccumulateGrad)
            acc._tensor = _wref(x)
        edge = (acc, 0, x)
    ctx.needs_input_grad = _NEEDS_FIRST[nargs - 1]
    node = _new(Node)
    node.hooks = None
    node.fn = cls
    node.ctx = ctx
    node.edges = (edge,) + _PAD[nargs - 1]
    node.out_meta = ((out._data.shape, out.dtype, out.device),)
    if out.dtype.category == 2:
        out.requires_grad = True
        out.grad_fn = node
        saved = ctx._saved
        if saved:
            if len(saved) == 1:
                if saved[0][0] is out:      # relu, exp, softmax...: _unlink_outputs' work
                    ctx._saved = ((_alias(out), saved[0][1]),)
                    ctx._outputs = _FIRST_OUTPUT
                    ctx._node = _wref(node)
            else:
                for t, _ in saved:
                    if t is out:
                        _unlink_outputs(ctx, node, out)
                        break
    return out


_FIRST_OUTPUT = ((0, 0),)


# needs_input_grad of one or two inputs, shared: _NEEDS[first][second], or
# _NEEDS[first][2] for one input
_NEEDS = (((False, False), (False, True), (False,)), ((True, False), (True, True), (True,)))


def _alias(t):
    """A new tensor object for ``t``'s data: same storage, version counter and
    view base, no autograd state."""
    a = _new(Tensor)
    a._data, a.dtype, a.device = t._data, t.dtype, t.device
    a.requires_grad = False
    a.grad = a.grad_fn = a._accumulator = a._hooks = None
    a._out_idx = 0
    a._version, a._base = t._version, t._base
    if t._placement is not None:
        a._placement, a._sbp, a._logical_shape = t._placement, t._sbp, t._logical_shape
    return a


def _unlink_outputs(ctx, node, out):
    """Keep the outputs ``forward`` saved (relu, exp, tanh... save their result)
    as aliases without a grad_fn.  The output itself refers to the node (its
    grad_fn) and the node to it (ctx): a cycle that only the garbage collector
    frees, so every such output, its memory and its graph outlived their use
    until a collection ran (and the collections took about a seventh of a small
    recorded relu's time).  ``saved_tensors`` gives each back as an output of the
    node again (grad_fn set), so double backward sees the same graph; ctx
    refers to the node weakly.  PyTorch's SavedVariable does the same."""
    saved = ctx._saved
    if type(out) is not tuple and len(saved) == 1:     # one output, one saved tensor
        t, version = saved[0]
        if t is out and t.grad_fn is node:
            ctx._saved, ctx._outputs, ctx._node = ((_alias(t), version),), ((0, 0),), _wref(node)
        return
    outs = out if type(out) is tuple else (out,)
    marks = []
    for i, (t, version) in enumerate(saved):
        if t is None or t.grad_fn is not node:
            continue
        for j, o in enumerate(outs):
            if t is o:
                marks.append((i, j))
                break
    if marks:
        saved = list(saved)
        for i, _ in marks:
            saved[i] = (_alias(saved[i][0]), saved[i][1])
        ctx._saved, ctx._outputs, ctx._node = tuple(saved), tuple(marks), _wref(node)


record = _attach


# ---------------------------------------------------------------- the engine
# Gradients waiting for a node are keyed by the node itself for its output 0
# and by (node, i) for its other outputs: most nodes have one output, and a
# node hashes faster than a tuple of its id.

def _key(edge):
    return edge[0] if edge[1] == 0 else edge


def _toposort(roots):
    """Nodes reachable from ``roots``, each after every node that feeds it grads."""
    order, seen = [], set()
    for root in roots:
        if root in seen:
            continue
        stack = [(root, iter(root.edges))]
        seen.add(root)
        while stack:
            node, it = stack[-1]
            for e in it:
                if e is not None and e[0] not in seen:
                    child = e[0]
                    seen.add(child)
                    stack.append((child, iter(child.edges)))
                    break
            else:
                stack.pop()
                order.append(node)
    order.reverse()
    return order


def _run_backward(outputs, grad_outputs, retain_graph, create_graph, inputs=None):
    """Propagate ``grad_outputs`` from ``outputs``.  With ``inputs`` the grads
    reaching them are returned instead of being accumulated into ``.grad``."""
    roots, pending = [], {}
    for t, g in zip(outputs, grad_outputs):
        e = _edge(t)
        if e is None:
            raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
        roots.append(e[0])
        key = _key(e)
        pending[key] = g if key not in pending else pending[key] + g
    targets = None
    if inputs is not None:
        targets = {}
        for i, t in enumerate(inputs):
            e = _edge(t)
            if e is None:
                raise RuntimeError(f"grad: input {i} does not require grad")
            targets[_key(e)] = i
    results = [None] * (len(inputs) if inputs is not None else 0)
    # Arrays a new .grad must not share: the given gradients (their callers hold
    # them) and, as they are stored, the gradients of other leaves.  One tensor
    # can reach several leaves (add's backward hands g to both operands), and a
    # .grad sharing another's storage would take the other's in-place
    # accumulation too (PyTorch copies a gradient whose storage is held elsewhere).
    held = None if create_graph else {id(g._data) for g in grad_outputs}

    mode = _mode                  # set_grad_enabled(create_graph), without its object
    prev = mode.enabled
    mode.enabled = bool(create_graph)
    try:
        for node in _toposort(roots):
            if type(node) is AccumulateGrad:
                g = pending.pop(node, None)
                if g is None:
                    continue
                if targets is not None:
                    if node in targets:
                        results[targets[node]] = g
                    continue
                _accumulate(node.tensor, g, create_graph, held)
                continue
            n_out = len(node.out_meta)
            g = pending.pop(node, None)
            if n_out == 1:
                if g is None:
                    continue
                if targets is not None and node in targets:
                    results[targets[node]] = g
                if node.hooks is None:      # the common case: Node.apply's work inline
                    ctx = node.ctx
                    if ctx._saved is None and ctx.needs_input_grad is None:
                        node.apply((g,))    # (raises: backward through a freed graph)
                    in_grads = node.fn.backward(ctx, g)
                    if not isinstance(in_grads, tuple):
                        in_grads = (in_grads,)
                    grads = None
                else:
                    grads = [g]
            else:
                grads = [g] + [pending.pop((node, i), None) for i in range(1, n_out)]
                if targets is not None:
                    for i, g in enumerate(grads):
                        key = node if i == 0 else (node, i)
                        if key in targets and g is not None:
                            results[targets[key]] = g
                if all(g is None for g in grads):
                    continue
            if grads is not None:
                if node.hooks:  # hooks on non-leaf outputs (register_hook, retain_grad)
                    for i, hooks in node.hooks.items():
                        for hook in hooks:
                            if grads[i] is not None:
                                r = hook(grads[i])
                                grads[i] = grads[i] if r is None else r
                in_grads = node.apply(grads)
            edges = node.edges
            if len(in_grads) < len(edges):
                raise RuntimeError(f"{node.fn.__name__}.backward returned {len(in_grads)} "
                                   f"gradients, expected {len(edges)} (one per forward input)")
            for e, g in zip(edges, in_grads):
                if e is None or g is None:
                    continue
                key = e[0] if e[1] == 0 else e
                prev_g = pending.get(key)
                pending[key] = g if prev_g is None else prev_g + g
            if not retain_graph:
                ctx = node.ctx              # (Node.release, inline)
                ctx._saved = None
                ctx.needs_input_grad = None
    finally:
        mode.enabled = prev
    return results


def _accumulate(t, g, create_graph, held=None):
    """Add gradient ``g`` into leaf ``t``'s ``.grad``.  A first gradient is kept
    as it is unless its storage may be another tensor's: a view (its array has
    a base), or an array in ``held`` (see _run_backward); it is added to ``held``."""
    if t._placement is not None:      # a global leaf: its gradient in its own SBP
        g = HOOKS.box_gradient(g, t)
    for hook in t._hooks or ():
        r = hook(g)
        if r is not None:
            g = r
    if g._logical_shape is None and t._logical_shape is None:
        mismatch = g._data.shape != t._data.shape      # (Tensor.shape, without two Sizes)
    else:
        mismatch = g.shape != t.shape
    if mismatch:
        raise RuntimeError(f"gradient of shape {tuple(g.shape)} does not match "
                           f"tensor of shape {tuple(t.shape)}")
    grad = t.grad
    if grad is None:
        if create_graph:
            t.grad = g
            return
        data = g._data
        if data.base is not None or held is not None and id(data) in held:
            t.grad = g.detach().clone()         # never alias another tensor
        else:
            t.grad = g.detach()
            if held is not None:
                held.add(id(data))
    elif create_graph:
        t.grad = grad + g
    elif not _add_into(grad, g):
        t.grad = grad.add_(g.detach())


def _add_into(dst, g):
    """``dst.add_(g)`` for two host tensors of one dtype and shape, by the add
    kernel writing into ``dst``'s storage: the same sum as ``add_`` (which adds
    into a new array and copies it in) without its dispatch.  False, having
    done nothing, in any other case."""
    d, gd = dst._data, g._data
    if type(d) is not np.ndarray or type(gd) is not np.ndarray or d.shape != gd.shape \
            or dst.dtype is not g.dtype or dst._placement is not None \
            or g._placement is not None or _trace.tracer is not None:
        return False
    dtype = dst.dtype
    if dtype.storage is not dtype.compute or not d.flags.writeable:
        return False
    _kernel("add", "cpu")(d, gd, out=d)
    dst._version[0] += 1
    return True


def _ones_like(t):
    """The implicit gradient of a one-element output: ones of its shape."""
    d = t._data
    dtype = t.dtype
    if type(d) is np.ndarray and dtype.storage is dtype.compute and t._placement is None \
            and _trace.tracer is None:
        ones = np.empty(d.shape, d.dtype)       # (np.ones is a Python function)
        ones.fill(1)
        return host_tensor(ones, dtype, t.device)
    return HOOKS.ones_like(t)


def _as_grads(tensors, grad_tensors, what):
    out = []
    for i, (t, g) in enumerate(zip(tensors, grad_tensors)):
        if g is None:
            if t.numel() != 1:
                raise RuntimeError(f"{what}: grad can be implicitly created only for scalar "
                                   f"outputs; output {i} has shape {tuple(t.shape)}, pass a gradient")
            g = _ones_like(t)
        elif tuple(g.shape) != tuple(t.shape):
            raise RuntimeError(f"{what}: gradient {i} has shape {tuple(g.shape)}, expected "
                               f"{tuple(t.shape)} (the shape of the output)")
        out.append(g)
    return out


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False):
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    if grad_tensors is None:
        grad_tensors = [None] * len(tensors)
    elif isinstance(grad_tensors, Tensor):
        grad_tensors = [grad_tensors]
    grads = _as_grads(tensors, grad_tensors, "backward")
    retain = create_graph if retain_graph is None else retain_graph
    _run_backward(tensors, grads, retain, create_graph)


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False,
         allow_unused=False):
    """Gradients of ``outputs`` with respect to ``inputs`` (not accumulated)."""
    outputs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    single = isinstance(inputs, Tensor)
    inputs = [inputs] if single else list(inputs)
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif isinstance(grad_outputs, Tensor):
        grad_outputs = [grad_outputs]
    grads = _as_grads(outputs, grad_outputs, "grad")
    retain = create_graph if retain_graph is None else retain_graph
    res = _run_backward(outputs, grads, retain, create_graph, inputs=inputs)
    for i, r in enumerate(res):
        if r is None and not allow_unused:
            raise RuntimeError(f"grad: input {i} was not used to compute the outputs; "
                               f"pass allow_unused=True to get None for it")
    return tuple(res)


HOOKS.provide(backward=backward, grad=grad)
