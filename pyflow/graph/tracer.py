"""Trace a ``build`` function into a logical ``Graph`` by running it once.

The tracer runs ``build(*inputs)`` eagerly on the first call's real inputs
(like ``torch.jit.trace``) and records every op at the top level of the user's
code: each ``Function.apply`` becomes a ``call`` node, each ``recordable`` op
an ``fn`` node, each generator seed a ``seed`` node.  Ops that other ops call
internally (depth > 0) are not recorded: a node is one user-visible op.

Why real inputs rather than symbolic tensors: every op already knows how to
compute its output shape, dtype and device by running; symbolic tracing would
need a second "meta" implementation of every op.  The price is the usual one of
tracing: Python control flow that depends on tensor *values* cannot be
captured, so reading values during a trace (``.item()``, ``bool(t)``,
``.numpy()``, ``.tolist()``) raises ``TracingError`` instead of silently baking
one branch into the graph.  Shapes are fixed per graph; ``nn.Graph`` compiles
one plan per input-shape signature.

Nothing the trace does may leak out: ``loss.backward()`` is recorded (the
autograd pass builds the backward later), optimizer steps are refused (use
``add_optimizer``), and in-place writes to tensors that existed before the
trace (parameters, buffers) are recorded as ``assign`` nodes and *not*
performed.  A state tensor whose version counter still moved during the trace
was written by a path the tracer cannot see: that is an error, not a silently
stale graph.
"""
import contextlib
import threading

import numpy as np

from .. import _tracing
from ..autograd import Context, Function, set_grad_enabled, is_grad_enabled
from ..random import Generator
from ..tensor import Tensor
from .ir import Graph, Node, Value, iter_instances, rebuild_tuple

__all__ = ["TracingError", "Tracer", "trace"]


class TracingError(RuntimeError):
    """build() did something a static graph cannot capture."""


class _TracedGrad:
    """The grad_fn of traced outputs: marks them as non-leaf for in-place
    checks; the eager engine never sees it (backward() is intercepted)."""

    def name(self):
        return "TracedBackward"


_TRACED_GRAD = _TracedGrad()


class TracedSeed(int):
    """A seed drawn during the trace: an int (ops use it as usual) that remembers
    the ``seed`` node's Value, so the graph draws a fresh one on every run."""
    value = None


_lock = threading.Lock()


class Tracer:
    def __init__(self, state_names=None):
        self.state_names = state_names or {}     # id(tensor) -> "model.fc1.weight"
        self.values = {}                          # id(tensor) -> its current Value
        self.alive = []                           # keeps traced tensors alive (stable ids)
        self.nodes = []
        self.state = []
        self.versions = {}                        # id(state tensor) -> version at first sight
        self.assigned = set()                     # ids of state tensors written by assign nodes
        self.backward = None
        self.depth = 0

    # ---------------------------------------------------------------- values
    def value_of(self, t):
        v = self.values.get(id(t))
        if v is None:   # a tensor from before the trace: read live at every run
            name = self.state_names.get(id(t), f"state{len(self.state)}")
            v = Value(tuple(t.shape), t.dtype, t.device, "state", name=name, tensor=t)
            self.values[id(t)] = v
            self.versions[id(t)] = t._version[0]
            self.state.append(v)
        return v

    def template(self, obj):
        if isinstance(obj, Tensor):
            return self.value_of(obj)
        if isinstance(obj, TracedSeed):
            return obj.value
        if isinstance(obj, list):
            return [self.template(o) for o in obj]
        if isinstance(obj, tuple):
            return rebuild_tuple(obj, [self.template(o) for o in obj])
        if isinstance(obj, dict):
            return {k: self.template(o) for k, o in obj.items()}
        return obj

    def bind(self, t, producer, kind="node", name=""):
        v = Value(tuple(t.shape), t.dtype, t.device, kind, name=name, producer=producer)
        self.values[id(t)] = v
        self.alive.append(t)
        return v

    def _add(self, kind, target, args, kwargs, outs, attrs):
        node = Node(kind, target, self.template(args), self.template(kwargs), [], attrs)
        node.name = f"{node.op_name.lower()}_{len(self.nodes)}"
        for i, t in enumerate(outs):
            node.outputs.append(self.bind(t, node, name=f"{node.name}" + (f".{i}" if i else "")))
        self.nodes.append(node)
        return node

    # ---------------------------------------------------------------- hooks
    def record_function(self, cls, args, kwargs):
        """Function.apply while tracing: run forward, record a ``call`` node."""
        if _has_raw_array((args, kwargs)):
            raise TracingError(
                f"{cls.__name__}.apply received a raw array, not a tensor: the graph would "
                f"bake its values in.  Mark the public op that calls it with "
                f"@pyflow._tracing.recordable(differentiable=True)")
        grad_enabled = is_grad_enabled()
        ctx = Context()
        self.depth += 1
        try:
            with set_grad_enabled(False):
                if _any_global(args) and not cls.handles_global:
                    # global tensors: one node all the same; the step deduces the SBP
                    # signature and boxes its inputs each run (executor.Step)
                    from ..distributed.dispatch import forward_global
                    out, ctx = forward_global(cls, args, kwargs)
                else:
                    out = cls.forward(ctx, *args, **kwargs)
        finally:
            self.depth -= 1
        outs = out if type(out) is tuple else (out,)
        nondiff = tuple(i for i, o in enumerate(outs)
                        if any(o is n for n in ctx.non_differentiable))
        attrs = dict(grad_enabled=grad_enabled, non_differentiable=nondiff,
                     tuple_output=type(out) is tuple)
        if ctx.__class__.__name__ == "GlobalContext":   # what explain shows of the SBP
            attrs["sbp"] = (ctx.placement, [o._sbp for o in outs], ctx.boxings)
        node = self._add("call", cls, args, kwargs, outs, attrs)
        self._mark_requires_grad(node, [a for a in args if isinstance(a, Tensor)], outs)
        return out

    def record_fn(self, fn, args, kwargs, random, differentiable=False):
        grad_enabled = is_grad_enabled()
        # an op recorded whole may write a state tensor it is given (batch_norm's
        # running statistics): undo that after the trace's run, and let the graph
        # do it on every call instead
        states = [t for t in _tensors((args, kwargs)) if self.value_of(t).kind == "state"]
        before = [(t, t._version[0], t._data.copy()) for t in states]
        self.depth += 1
        try:
            out = fn(*args, **kwargs)
        finally:
            self.depth -= 1
        written = []
        for t, version, data in before:
            if t._version[0] != version:
                t._data[...] = data
                t._version[0] = version
                written.append(self.value_of(t))
        outs = out if isinstance(out, tuple) else (out,)
        if not all(isinstance(o, Tensor) for o in outs):
            raise TracingError(f"{fn.__name__}() returned {type(out).__name__}; only ops "
                               f"returning tensors can be recorded in a graph")
        node = self._add("fn", fn, args, kwargs, outs,
                         dict(random=random, tuple_output=isinstance(out, tuple),
                              differentiable=differentiable, grad_enabled=grad_enabled,
                              writes=written))
        if differentiable:
            self._mark_requires_grad(node, list(_tensors((args, kwargs))), outs)
        return out

    @staticmethod
    def _mark_requires_grad(node, inputs, outs):
        """Outputs require grad as eager autograd would say (user code may ask)."""
        nondiff = node.attrs.get("non_differentiable", ())
        needs = node.attrs["grad_enabled"] and any(t.requires_grad for t in inputs)
        for i, o in enumerate(outs):
            if needs and o.dtype.is_floating_point and i not in nondiff:
                o.requires_grad, o.grad_fn, o._out_idx = True, _TRACED_GRAD, i

    def record_seed(self, generator, seed):
        node = Node("seed", generator, (), {}, [], {})
        node.name = f"seed_{len(self.nodes)}"
        from .. import dtypes
        value = Value((), dtypes.int64, None, "node", name=node.name, producer=node)
        node.outputs.append(value)
        self.nodes.append(node)
        traced = TracedSeed(seed)
        traced.value = value
        return traced

    def record_inplace(self, dst, result):
        """``dst`` takes ``result``'s value.  A state tensor is not written now:
        an ``assign`` node writes it when the graph runs (returns True)."""
        v = self.value_of(dst)
        if v.kind != "state":
            self.values[id(dst)] = self.value_of(result)
            return False
        new = self.value_of(result)
        if new.dtype is not v.dtype:
            from ..ops import cast
            new = self.value_of(cast(result, v.dtype))
        node = Node("assign", v.tensor, (new,), {}, [], {"state": v})
        node.name = f"assign_{v.name}"
        self.nodes.append(node)
        self.values[id(dst)] = new
        self.assigned.add(id(dst))
        return True

    def record_backward(self, loss, gradient):
        if self.backward is not None:
            raise TracingError("build() called backward() twice; a graph has one backward pass")
        if not isinstance(loss, Tensor) or id(loss) not in self.values:
            raise TracingError("backward() in build() must be called on a tensor computed in build()")
        if not loss.requires_grad:
            raise TracingError("element 0 of tensors does not require grad and does not have a "
                               "grad_fn (backward() of a value that depends on no parameter)")
        grad = None
        if gradient is not None:
            grad = self.template(gradient)
        elif loss.numel() != 1:
            raise TracingError("grad can be implicitly created only for scalar outputs")
        self.backward = (self.value_of(loss), grad)
        self.loss_placement = loss._placement       # a global loss seeds a global grad


def _refuse(what):
    def method(self, *args, **kwargs):
        active = _tracing.tracer
        if active is not None and not active.depth:
            raise TracingError(
                f"build() reads tensor values ({what}); a traced graph cannot depend on data. "
                f"Keep value-dependent Python code outside build(), or use tensor ops "
                f"(e.g. pyflow.where) instead of Python branches.")
        return _ORIGINAL[what](self, *args, **kwargs)
    return method


_ORIGINAL = {}
_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__",
          "__array__")


@contextlib.contextmanager
def _patched(tracer):
    """Install the tracer's hooks on Function, Tensor and Generator."""
    original_apply = Function.__dict__["apply"]
    original_make = Tensor.__dict__["_make"]
    original_backward = Tensor.backward
    original_detach = Tensor.detach
    original_data = Tensor.__dict__["data"]
    original_draw = Generator.draw_seed

    def apply(cls, *args, **kwargs):
        if tracer.depth:
            return original_apply.__func__(cls, *args, **kwargs)
        return tracer.record_function(cls, args, kwargs)

    def make(cls, data, dtype, device=None, requires_grad=False, base=None):
        t = original_make.__func__(cls, data, dtype, *(() if device is None else (device,)),
                                   requires_grad=requires_grad, base=base)
        if not tracer.depth:
            if base is not None and data is base._data:      # an identity view: same value
                tracer.values[id(t)] = tracer.value_of(base)
                tracer.alive.append(t)
            else:
                raise TracingError(
                    "a tensor was made outside any recorded op during the trace (an op that is "
                    "neither an autograd Function nor marked pyflow._tracing.recordable)")
        return t

    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        if tracer.depth:
            return original_backward(self, gradient, retain_graph, create_graph, inputs)
        if create_graph or inputs is not None:
            raise TracingError("backward(create_graph=True or inputs=...) is not supported in a "
                               "graph")
        tracer.record_backward(self, gradient)

    def detach(self):
        if tracer.depth:
            return original_detach(self)
        return tracer.record_fn(original_detach, (self,), {}, False, False)

    def draw_seed(self):
        seed = original_draw(self)
        return seed if tracer.depth else tracer.record_seed(self, seed)

    patches = [(Function, "apply", classmethod(apply)), (Tensor, "_make", classmethod(make)),
               (Tensor, "backward", backward), (Tensor, "detach", detach),
               (Tensor, "data", property(lambda self: detach(self), original_data.fset)),
               (Generator, "draw_seed", draw_seed)]
    patches += [(Tensor, name, _refuse(name)) for name in _READS]
    patches += [(cls, "step", _refused_step) for cls in _optimizer_classes()]
    _ORIGINAL.update({name: getattr(Tensor, name) for name in _READS})
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    with _lock:
        for owner, name, hook in patches:
            setattr(owner, name, hook)
        _tracing.tracer = tracer
        try:
            yield
        finally:
            _tracing.tracer = None
            for owner, name, original in saved:
                setattr(owner, name, original)


def _any_global(args):
    return any(isinstance(a, Tensor) and a._placement is not None for a in args)


def _has_raw_array(obj):
    """A NumPy (non-scalar) or device array anywhere in ``obj``."""
    if isinstance(obj, np.ndarray):
        return obj.ndim > 0
    if hasattr(obj, "__cuda_array_interface__") and not isinstance(obj, Tensor):
        return True
    if isinstance(obj, (list, tuple)):
        return any(_has_raw_array(o) for o in obj)
    if isinstance(obj, dict):
        return any(_has_raw_array(o) for o in obj.values())
    return False


def _tensors(obj):
    return iter_instances(obj, Tensor)


def _optimizer_classes():
    from ..optim.optimizer import Optimizer
    todo, found = [Optimizer], []
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in found if "step" in c.__dict__]


def _refused_step(self, *args, **kwargs):
    raise TracingError("optimizer.step() inside build(): register the optimizer with "
                       "graph.add_optimizer(optimizer) and the graph runs its update after "
                       "the backward pass")


def trace(build, inputs, state_names=None):
    """Run ``build(*inputs)`` once and return its ``Graph``.  Tensor arguments
    become the graph's inputs; other arguments are baked in as constants."""
    tracer = Tracer(state_names)
    if _tracing.tracer is not None:
        raise TracingError("a graph is already being traced (nested or concurrent tracing)")
    graph_inputs = []
    for i, x in enumerate(inputs):
        if isinstance(x, Tensor):
            graph_inputs.append(tracer.bind(x, None, kind="input", name=f"input{i}"))
    with _patched(tracer):
        result = build(*inputs)
    outputs = tracer.template(result)
    for v in tracer.state:
        t = v.tensor
        if t._version[0] != tracer.versions[id(t)] and id(t) not in tracer.assigned:
            raise TracingError(
                f"build() modified {v.name} (a tensor from outside the graph) in place through "
                f"an op the tracer cannot record; use an out-of-place op or an in-place "
                f"tensor method (add_, mul_, copy_, ...)")
    graph = Graph(tracer.nodes, graph_inputs, outputs, tracer.state, tracer.backward)
    # Over global tensors the steps run collectives (boxing), which every rank must
    # post in the same order: lowering chains the steps in program order.
    graph.loss_placement = getattr(tracer, "loss_placement", None)
    graph.is_global = any(isinstance(x, Tensor) and x._placement is not None for x in inputs) \
        or any(v.tensor._placement is not None for v in tracer.state)
    graph.history.append(("trace", f"{len(tracer.nodes)} nodes from build()"))
    return graph

