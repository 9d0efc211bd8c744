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

from ._hooks import HOOKS
from .tensor import Tensor

__all__ = ["Function", "backward", "grad", "no_grad", "enable_grad",
           "set_grad_enabled", "is_grad_enabled"]


# ---------------------------------------------------------------- grad mode
class _GradMode(threading.local):
    enabled = True


_mode = _GradMode()


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


# ---------------------------------------------------------------- the tape
class Context:
    """What ``forward`` leaves for ``backward``."""

    # Class-level defaults: creating a Context costs nothing on the hot path.
    _saved = ()
    needs_input_grad = ()
    non_differentiable = ()
    materialize_grads = True

    def save_for_backward(self, *tensors):
        # Remember each tensor's version: an in-place change before backward
        # would silently corrupt the gradient, so backward checks it.
        self._saved = tuple((t, t._version[0]) if t is not None else (None, 0) for t in tensors)

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
        self.edges = edges        # per input: (Node, output index) or None
        self.out_meta = out_meta  # per output: (shape, dtype, device) for zero grads

    def name(self):
        return self.fn.__name__ + "Backward"

    def __repr__(self):
        return f"<{self.name()}>"

    @property
    def next_functions(self):
        return tuple(self.edges)

    def apply(self, grads):
        ctx = self.ctx
        if ctx._saved is None and ctx.needs_input_grad is None:
            raise RuntimeError("Trying to backward through the graph a second time; "
                               "pass retain_graph=True to the first backward().")
        if ctx.materialize_grads:
            grads = [g if g is not None else HOOKS.zeros(s, dtype=d, device=dev)
                     for g, (s, d, dev) in zip(grads, self.out_meta)]
        res = self.fn.backward(ctx, *grads)
        if not isinstance(res, tuple):
            res = (res,)
        return res

    def release(self):
        self.ctx._saved = None
        self.ctx.needs_input_grad = None


class AccumulateGrad:
    """Sink of a leaf tensor: adds the incoming gradient into ``tensor.grad``."""
    __slots__ = ("tensor", "__weakref__")
    edges = ()

    def __init__(self, tensor):
        self.tensor = tensor

    def name(self):
        return "AccumulateGrad"

    def __repr__(self):
        return "<AccumulateGrad>"

    next_functions = ()


def _leaf_edge(t):
    """The leaf's AccumulateGrad node: one per leaf while a graph uses it.

    The tensor refers to its node only weakly (PyTorch's ``grad_accumulator_``
    is a weak pointer too): the node refers to the tensor, and a strong
    reference back would make a cycle that only the cyclic garbage collector
    frees.  Graph mode makes fresh leaves of activations every step (ops run
    with eager autograd, executor.py), and those cycles kept about 27 MB of
    ResNet-50 activations a step alive until a collection ran."""
    ref = t._accumulator
    acc = None if ref is None else ref()
    if acc is None:
        acc = AccumulateGrad(t)
        t._accumulator = weakref.ref(acc)
    return (acc, 0)


def _edge(t):
    if t.grad_fn is not None:
        return (t.grad_fn, t._out_idx)
    if t.requires_grad:
        return _leaf_edge(t)
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


def _attach(cls, ctx, args, out):
    """Record one call: a Node that is the grad_fn of every differentiable output."""
    needs, edges = [], []
    for a in args:
        if isinstance(a, Tensor) and a.requires_grad:
            needs.append(True)
            fn = a.grad_fn
            edges.append((fn, a._out_idx) if fn is not None else _leaf_edge(a))
        else:
            needs.append(False)
            edges.append(None)
    ctx.needs_input_grad = tuple(needs)
    if type(out) is tuple:
        node = Node(cls, ctx, tuple(edges), tuple((o._data.shape, o.dtype, o.device) for o in out))
        nondiff = ctx.non_differentiable
        for i, o in enumerate(out):
            if o.dtype.is_floating_point and not any(o is n for n in nondiff):
                o.requires_grad, o.grad_fn, o._out_idx = True, node, i
    else:
        node = Node(cls, ctx, tuple(edges), ((out._data.shape, out.dtype, out.device),))
        if out.dtype.category == 2 and not ctx.non_differentiable:
            out.requires_grad, out.grad_fn = True, node


# ---------------------------------------------------------------- the engine
def _toposort(roots):
    """Nodes reachable from ``roots``, each after every node that feeds it grads."""
    order, seen = [], set()
    for root in roots:
        if id(root) in seen:
            continue
        stack = [(root, iter(root.edges))]
        seen.add(id(root))
        while stack:
            node, it = stack[-1]
            for e in it:
                if e is not None and id(e[0]) not in seen:
                    seen.add(id(e[0]))
                    stack.append((e[0], iter(e[0].edges)))
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
        key = (id(e[0]), e[1])
        pending[key] = g if key not in pending else pending[key] + g
    targets = None
    if inputs is not None:
        targets = {}
        for i, t in enumerate(inputs):
            e = _edge(t)
            if e is None:
                raise RuntimeError(f"grad: input {i} does not require grad")
            targets[(id(e[0]), e[1])] = i
    results = [None] * (len(inputs) if inputs is not None else 0)

    with set_grad_enabled(create_graph):
        for node in _toposort(roots):
            if type(node) is AccumulateGrad:
                g = pending.pop((id(node), 0), None)
                if g is None:
                    continue
                if targets is not None:
                    if (id(node), 0) in targets:
                        results[targets[(id(node), 0)]] = g
                    continue
                _accumulate(node.tensor, g, create_graph)
                continue
            n_out = len(node.out_meta)
            grads = [pending.pop((id(node), i), None) for i in range(n_out)]
            if targets is not None:
                for i, g in enumerate(grads):
                    if (id(node), i) in targets and g is not None:
                        results[targets[(id(node), i)]] = g
            if all(g is None for g in grads):
                continue
            if node.hooks:  # hooks registered on non-leaf outputs (register_hook, retain_grad)
                for i, hooks in node.hooks.items():
                    for hook in hooks:
                        if grads[i] is not None:
                            r = hook(grads[i])
                            grads[i] = grads[i] if r is None else r
            in_grads = node.apply(grads)
            if len(in_grads) < len(node.edges):
                raise RuntimeError(f"{node.fn.__name__}.backward returned {len(in_grads)} "
                                   f"gradients, expected {len(node.edges)} (one per forward input)")
            for e, g in zip(node.edges, in_grads):
                if e is None or g is None:
                    continue
                key = (id(e[0]), e[1])
                prev = pending.get(key)
                pending[key] = g if prev is None else prev + g
            if not retain_graph:
                node.release()
    return results


def _accumulate(t, g, create_graph):
    if t._placement is not None:      # a global leaf: its gradient in its own SBP
        g = HOOKS.box_gradient(g, t)
    for hook in t._hooks or ():
        r = hook(g)
        if r is not None:
            g = r
    if g.shape != t.shape:
        raise RuntimeError(f"gradient of shape {tuple(g.shape)} does not match "
                           f"tensor of shape {tuple(t.shape)}")
    if t.grad is None:
        t.grad = g if create_graph else g.detach()
        if not create_graph and g._data.base is not None:  # never alias another tensor
            t.grad = g.detach().clone()
    else:
        t.grad = t.grad + g if create_graph else t.grad.add_(g.detach())


def _as_grads(tensors, grad_tensors, what):
    out = []
    for i, (t, g) in enumerate(zip(tensors, grad_tensors)):
        if g is None:
            if t.numel() != 1:
                raise RuntimeError(f"{what}: grad can be implicitly created only for scalar "
                                   f"outputs; output {i} has shape {tuple(t.shape)}, pass a gradient")
            g = HOOKS.ones_like(t)
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
