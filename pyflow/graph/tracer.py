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
``add_optimizer``), random draws come from private copies of the generators
(the graph draws from the real ones when it runs), and in-place writes to
tensors that existed before the trace are *not* performed: those to
parameters and buffers become ``assign`` nodes, those to build()'s tensor
arguments are written back into the caller's tensors after every run
(``Graph.input_writes``).  A write the tracer cannot see (``t[i] = v``,
``fill_``, a write through a view whose other views are read later) would
leave the graph silently stale, so it is an error: every tensor's version
counter is checked when the tensor is read and at the end of the trace.

Tracing is per thread (``pyflow._hooks``): the hooks on ``Function.apply``,
``Tensor`` and ``Generator`` are installed while any thread traces, but they
record only for the thread whose trace is active; in every other thread they
call the original methods.
"""
import contextlib
import copy
import inspect
import threading

import numpy as np

from .. import _hooks
from ..optim.optimizer import Optimizer
from ..autograd import Function, set_grad_enabled, is_grad_enabled
from ..distributed.dispatch import GlobalContext, recording_signatures, run_forward
from ..random import Generator
from ..tensor import Tensor
from .ir import Graph, Node, Value, iter_instances, rebuild_tuple

__all__ = ["TracingError", "Tracer", "trace"]


TracingError = _hooks.TracingError   # build() did something a static graph cannot capture


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


_UNRECORDED = ("Use an out-of-place op, or an in-place tensor method the graph records "
               "(add_, mul_, copy_, masked_fill_, ...) on the tensor itself")


class Tracer:
    def __init__(self, state_names=None, labels=None):
        self.state_names = state_names or {}     # id(tensor) -> "model.fc1.weight"
        self.labels = labels or {}                # input Value name -> "its argument 'x' ..."
        self.values = {}                          # id(tensor) -> its current Value
        self.alive = []                           # keeps traced tensors alive (stable ids)
        self.nodes = []
        self.state = []
        self.versions = {}                        # id(state tensor) -> version at first sight
        # id(tensor) -> its first Value, for the tensors that are graph inputs or state:
        # after an in-place write it has a new Value, but it is still that input or state
        self.origins = {}
        self.assigned = {}                        # id(state tensor) -> number of its assign nodes
        # id(version counter) -> [counter, the version the trace expects, tensors sharing
        # it]: views share their base's counter, so a write through one is seen by all
        self.counters = {}
        self.stale = {}                           # id(tensor) -> why it may no longer be read
        self.generators = {}                      # id(Generator) -> (it, its private copy)
        self.backward = None
        self.depth = 0

    # ---------------------------------------------------------------- values
    def value_of(self, t):
        v = self.values.get(id(t))
        if v is None:   # a tensor from before the trace: read live at every run
            name = self.state_names.get(id(t), f"state{len(self.state)}")
            v = Value(tuple(t.shape), t.dtype, t.device, "state", name=name, tensor=t,
                      placement=t._placement, sbp=t._sbp)
            self.values[id(t)] = self.origins[id(t)] = v
            self.versions[id(t)] = t._version[0]
            self.state.append(v)
            self._track(t)
            return v
        self._check_readable(t, v)
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
        v = Value(tuple(t.shape), t.dtype, t.device, kind, name=name, producer=producer,
                  placement=t._placement, sbp=t._sbp)
        if kind == "input":
            v.requires_grad = bool(t.requires_grad)
            self.origins[id(t)] = v
        self.values[id(t)] = v
        self.alive.append(t)
        self._track(t)
        return v

    def alias(self, t, base):
        """``t`` shows all of ``base``'s memory (an identity view): the same Value."""
        self.values[id(t)] = self.value_of(base)
        self.alive.append(t)
        self._track(t)

    def describe(self, v, t=None):
        """How an error names Value ``v`` (of tensor ``t``: an input or state
        tensor is named as such whatever Value an in-place write gave it)."""
        v = self.origins.get(id(t), v) if t is not None else v
        if v.kind == "input":
            return self.labels.get(v.name, v.name)
        if v.kind == "state":
            return v.name
        return f"the result of {v.producer.name if v.producer is not None else v.name}"

    # ------------------------------------------------- writes the graph must see
    def _track(self, t):
        entry = self.counters.get(id(t._version))
        if entry is None:
            self.counters[id(t._version)] = entry = [t._version, t._version[0], []]
        entry[2].append(t)

    def _check_readable(self, t, v):
        why = self.stale.get(id(t))
        if why is not None:
            raise TracingError(f"build() reads {self.describe(v, t)} after {why}; in eager mode it "
                               f"sees that write, in a graph it would not.  {_UNRECORDED}")
        entry = self.counters.get(id(t._version))
        if entry is not None and t._version[0] != entry[1]:
            raise TracingError(
                f"build() modified {self.describe(v, t)} in place through an op the tracer cannot "
                f"record (t[...] = v, fill_, zero_, a write through .data, ...): the graph would "
                f"not repeat it.  {_UNRECORDED}")

    def _aliases_written(self, dst, v, new):
        """``dst`` (Value ``v``) takes Value ``new``: what that means for the other
        tensors sharing its memory (views, detached copies)."""
        for t in self.counters[id(dst._version)][2]:
            w = self.values.get(id(t))
            if t is dst or w is None:
                continue
            if id(t) in self.origins:
                raise TracingError(
                    f"build() writes {self.describe(v, dst)} in place, and it shares memory with "
                    f"{self.describe(w, t)}: a graph records an in-place write to an input, "
                    f"parameter or buffer only when it is made on that tensor itself, not "
                    f"through a view of it or another tensor viewing it.  {_UNRECORDED}")
            if w is v:              # an identity view: it shows the new value too
                self.values[id(t)] = new
            else:
                # a view the graph computed from the old value: it may not be read
                # again (eager mode would see the write through it)
                self.stale[id(t)] = (f"an in-place write to {self.describe(v, dst)}, whose "
                                     f"memory it shares")

    # ---------------------------------------------------------------- hooks
    def record_function(self, cls, args, kwargs):
        """Function.apply while tracing: run forward, record a ``call`` node."""
        if _has_raw_array((args, kwargs)):
            raise TracingError(
                f"{cls.__name__}.apply received a raw array, not a tensor (an index or mask "
                f"read from a tensor, say): the graph would bake its values in.  In build(), "
                f"use ops that take the tensor (pyflow.where, masked_fill, gather, "
                f"index_select); an op's author marks the public op that calls it with "
                f"@pyflow._hooks.recordable(differentiable=True)")
        for t in _tensors((args, kwargs)):
            self.value_of(t)        # refuses stale inputs before the forward runs
        grad_enabled = is_grad_enabled()
        self.depth += 1
        try:
            with set_grad_enabled(False):
                # global tensors: one node all the same, with the signature the
                # dispatch chose (passes.sbp keeps it and puts box nodes before it)
                out, ctx = run_forward(cls, args, kwargs)
        finally:
            self.depth -= 1
        outs = out if type(out) is tuple else (out,)
        nondiff = tuple(i for i, o in enumerate(outs)
                        if any(o is n for n in ctx.non_differentiable))
        attrs = dict(grad_enabled=grad_enabled, non_differentiable=nondiff,
                     tuple_output=type(out) is tuple)
        if isinstance(ctx, GlobalContext):      # what explain shows of the SBP
            attrs["sbp"] = (ctx.placement, [o._sbp for o in outs], ctx.boxings)
            attrs["signature"] = (cls, ctx.placement, tuple(ctx.chosen))
        node = self._add("call", cls, args, kwargs, outs, attrs)
        self._mark_requires_grad(node, [a for a in args if isinstance(a, Tensor)], outs)
        return out

    def _add(self, kind, target, args, kwargs, outs, attrs):
        node = Node(kind, target, self.template(args), self.template(kwargs), [], attrs)
        node.name = f"{node.op_name.lower()}_{len(self.nodes)}"
        for i, t in enumerate(outs):
            node.outputs.append(self.bind(t, node, name=f"{node.name}" + (f".{i}" if i else "")))
        self.nodes.append(node)
        return node

    def record_fn(self, fn, args, kwargs, random, differentiable=False):
        grad_enabled = is_grad_enabled()
        # an op recorded whole may write a state tensor it is given (batch_norm's
        # running statistics): undo that after the trace's run, and let the graph
        # do it on every call instead
        states = [t for t in _tensors((args, kwargs)) if self.value_of(t).kind == "state"]
        before = [(t, t._version[0], t._data.copy()) for t in states]
        self.depth += 1
        try:
            # the global ops inside keep the signatures they chose: the node
            # replays them at every run (dispatch.replaying)
            with recording_signatures() as signatures:
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
        if signatures:
            node.attrs["replay"] = tuple(signatures)
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

    def private_generator(self, generator):
        """The trace's own copy of ``generator``: draws during the trace must not
        move the stream other threads (and the graph's runs) draw from."""
        entry = self.generators.get(id(generator))
        if entry is None:
            entry = self.generators[id(generator)] = (generator, copy.deepcopy(generator))
        return entry[1]

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
        """``dst`` takes ``result``'s value.  A state tensor or a graph input is
        not written now (returns True): an ``assign`` node writes a state tensor
        when the graph runs, and an input gets its last value written back after
        each run (``trace``).  An intermediate is written by the op (False)."""
        v = self.value_of(dst)
        new = self.value_of(result)
        if new.dtype is not v.dtype:        # dst keeps its dtype
            from ..ops import cast
            new = self.value_of(cast(result, v.dtype))
        self._aliases_written(dst, v, new)
        self.values[id(dst)] = new
        origin = self.origins.get(id(dst))
        if origin is None:                  # an intermediate: the op writes it, next
            self.counters[id(dst._version)][1] += 1
            return False
        if origin.kind == "state":
            node = Node("assign", origin.tensor, (new,), {}, [], {"state": origin})
            node.name = f"assign_{origin.name}" + (f".{self.assigned[id(dst)]}"
                                                   if id(dst) in self.assigned else "")
            self.nodes.append(node)
            self.assigned[id(dst)] = self.assigned.get(id(dst), 0) + 1
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


# ------------------------------------------------------------------ the hooks
# Installed on the classes while at least one thread traces (``_install``), and
# removed when the last trace ends.  Each one asks ``_hooks.active()`` for the
# calling thread's tracer and, without one, calls the original: a thread that
# is not tracing sees eager mode unchanged.

_ORIGINAL = {}                  # hook name -> the original function (never cleared)
_hooks_lock = threading.Lock()
_hooks_users = 0                # threads tracing now
_hooks_saved = []               # (owner, attribute name, original attribute)
_READS = ("item", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__",
          "__array__")


def _apply(cls, *args, **kwargs):
    tracer = _hooks.active()
    if tracer is None or tracer.depth:
        return _ORIGINAL["apply"](cls, *args, **kwargs)
    return tracer.record_function(cls, args, kwargs)


def _make(cls, data, dtype, device=None, requires_grad=False, base=None):
    t = _ORIGINAL["_make"](cls, data, dtype, *(() if device is None else (device,)),
                           requires_grad=requires_grad, base=base)
    tracer = _hooks.active()
    if tracer is not None and not tracer.depth:
        if base is not None and data is base._data:      # an identity view: same value
            tracer.alias(t, base)
        else:
            raise TracingError(
                "a tensor was made outside any recorded op during the trace (an op that is "
                "neither an autograd Function nor marked pyflow._hooks.recordable)")
    return t


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    tracer = _hooks.active()
    if tracer is None or tracer.depth:
        return _ORIGINAL["backward"](self, gradient, retain_graph, create_graph, inputs)
    if create_graph or inputs is not None:
        raise TracingError("backward(create_graph=True or inputs=...) is not supported in a "
                           "graph")
    tracer.record_backward(self, gradient)


def _detach(self):
    tracer = _hooks.active()
    if tracer is None or tracer.depth:
        return _ORIGINAL["detach"](self)
    return tracer.record_fn(_ORIGINAL["detach"], (self,), {}, False, False)


def _draw_seed(self):
    tracer = _hooks.active()
    if tracer is None:
        return _ORIGINAL["draw_seed"](self)
    seed = _ORIGINAL["draw_seed"](tracer.private_generator(self))
    return seed if tracer.depth else tracer.record_seed(self, seed)


def _generator_numpy(self):
    tracer = _hooks.active()
    return _ORIGINAL["numpy_rng"](self if tracer is None else tracer.private_generator(self))


def _refuse(what):
    def method(self, *args, **kwargs):
        tracer = _hooks.active()
        if tracer is not None and not tracer.depth:
            raise TracingError(
                f"build() reads tensor values ({what}); a traced graph cannot depend on data. "
                f"Keep value-dependent Python code outside build(), or use tensor ops "
                f"(e.g. pyflow.where) instead of Python branches.")
        return _ORIGINAL[what](self, *args, **kwargs)
    method.__name__ = what
    return method


def _refused_step(original):
    def step(self, *args, **kwargs):
        if _hooks.active() is not None:
            raise TracingError("optimizer.step() inside build(): register the optimizer with "
                               "graph.add_optimizer(optimizer) and the graph runs its update "
                               "after the backward pass")
        return original(self, *args, **kwargs)
    step.__name__ = "step"
    return step


def _install():
    global _hooks_users
    with _hooks_lock:
        _hooks_users += 1
        if _hooks_users > 1:
            return
        data = Tensor.__dict__["data"]
        _ORIGINAL.update(apply=Function.__dict__["apply"].__func__,
                         _make=Tensor.__dict__["_make"].__func__,
                         backward=Tensor.__dict__["backward"], detach=Tensor.__dict__["detach"],
                         draw_seed=Generator.__dict__["draw_seed"],
                         numpy_rng=Generator.__dict__["numpy"].fget)
        _ORIGINAL.update({name: Tensor.__dict__[name] for name in _READS})
        patches = [(Function, "apply", classmethod(_apply)), (Tensor, "_make", classmethod(_make)),
                   (Tensor, "backward", _backward), (Tensor, "detach", _detach),
                   (Tensor, "data", property(_detach, data.fset)),
                   (Generator, "draw_seed", _draw_seed),
                   (Generator, "numpy", property(_generator_numpy))]
        patches += [(Tensor, name, _refuse(name)) for name in _READS]
        patches += [(cls, "step", _refused_step(cls.__dict__["step"]))
                    for cls in _optimizer_classes()]
        _hooks_saved[:] = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
        for owner, name, hook in patches:
            setattr(owner, name, hook)


def _uninstall():
    global _hooks_users
    with _hooks_lock:
        _hooks_users -= 1
        if _hooks_users:
            return
        for owner, name, original in _hooks_saved:
            setattr(owner, name, original)
        _hooks_saved.clear()


@contextlib.contextmanager
def _tracing_in_this_thread(tracer):
    _install()
    _hooks.set_active(tracer)
    try:
        yield
    finally:
        _hooks.set_active(None)
        _uninstall()


def _has_raw_array(obj, depth=0):
    """A NumPy (non-scalar) or device array anywhere in ``obj``, small value
    objects with ``__slots__`` included (a parsed index key holds its index
    arrays so: ``x[mask] = v`` in build() baked the trace's mask in)."""
    if isinstance(obj, np.ndarray):
        return obj.ndim > 0
    if isinstance(obj, Tensor) or depth > 4:
        return False
    if hasattr(obj, "__cuda_array_interface__"):
        return True
    if isinstance(obj, (list, tuple)):
        return any(_has_raw_array(o, depth + 1) for o in obj)
    if isinstance(obj, dict):
        return any(_has_raw_array(o, depth + 1) for o in obj.values())
    slots = getattr(type(obj), "__slots__", ())
    slots = (slots,) if isinstance(slots, str) else slots
    return any(_has_raw_array(getattr(obj, name, None), depth + 1) for name in slots)


def _tensors(obj):
    return iter_instances(obj, Tensor)


def _optimizer_classes():
    todo, found = [Optimizer], []
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in found if "step" in c.__dict__]


def _argument_labels(build, inputs):
    """{input Value name: how an error names it}: "its argument 'x' (input 0)"."""
    try:
        params = list(inspect.signature(build).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = []
    for p in params:
        if p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            break
        names.append(p.name)
    return {f"input{i}": (f"its argument {names[i]!r} (input {i})" if i < len(names)
                          else f"its input {i}")
            for i in range(len(inputs))}


def trace(build, inputs, state_names=None):
    """Run ``build(*inputs)`` once and return its ``Graph``.  Tensor arguments
    become the graph's inputs; other arguments are baked in as constants."""
    if _hooks.active() is not None:
        raise TracingError("a graph is already being traced in this thread (a graph called "
                           "inside build(), or build() calling its own graph)")
    tracer = Tracer(state_names, _argument_labels(build, inputs))
    graph_inputs, input_tensors = [], []
    for i, x in enumerate(inputs):
        if isinstance(x, Tensor):
            graph_inputs.append(tracer.bind(x, None, kind="input", name=f"input{i}"))
            input_tensors.append(x)
    with _tracing_in_this_thread(tracer):
        result = build(*inputs)
        outputs = tracer.template(result)
    for v in tracer.state:
        t = v.tensor
        if t._version[0] != tracer.versions[id(t)] and id(t) not in tracer.assigned:
            raise TracingError(
                f"build() modified {v.name} (a tensor from outside the graph) in place through "
                f"an op the tracer cannot record; {_UNRECORDED}")
    # An input written in place: its last Value goes back into the caller's tensor
    # after each run.  An input whose memory changed any other way was written by
    # an op the tracer cannot see.
    written, finals = [], []
    for k, (v, x) in enumerate(zip(graph_inputs, input_tensors)):
        entry = tracer.counters[id(x._version)]
        if x._version[0] != entry[1]:
            raise TracingError(
                f"build() modified {tracer.describe(v, x)} in place through an op the tracer "
                f"cannot record (t[...] = v, fill_, zero_, ...): the graph would not repeat it "
                f"on later calls.  {_UNRECORDED}")
        last = tracer.values[id(x)]
        if last is not v:
            written.append(k)
            finals.append(last)
    graph = Graph(tracer.nodes, graph_inputs, outputs, tracer.state, tracer.backward)
    if written:
        graph.outputs, graph.input_writes = (outputs, tuple(finals)), tuple(written)
    # Over global tensors the steps run collectives (boxing), which every rank must
    # post in the same order: lowering chains the steps in program order.
    graph.loss_placement = getattr(tracer, "loss_placement", None)
    graph.is_global = any(isinstance(x, Tensor) and x._placement is not None for x in inputs) \
        or any(v.tensor._placement is not None for v in tracer.state)
    graph.history.append(("trace", f"{len(tracer.nodes)} nodes from build()"))
    return graph
