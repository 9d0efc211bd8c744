"""nn.Graph: a training or inference step compiled once, run as a static graph
(OneFlow's ``oneflow.nn.Graph``)::

    class TrainGraph(pyflow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.loss_fn = pyflow.nn.CrossEntropyLoss()
            self.add_optimizer(optimizer, lr_sch=scheduler)

        def build(self, x, y):
            loss = self.loss_fn(self.model(x), y)
            loss.backward()
            return loss

    graph = TrainGraph()
    loss = graph(x, y)          # compiles on the first call, then runs the plan

The first call with a new input signature (shapes, dtypes, devices and
``requires_grad`` of the tensor arguments, non-tensor arguments, the
``training`` flags of the registered modules and ``requires_grad`` of their
parameters, ``graph.config``) traces ``build`` and compiles a plan
(``pyflow.graph.plan``); later calls with the same signature run it.  A new
signature compiles and caches another plan, so a different batch size never
crashes or silently reuses a wrong plan.  The cache keeps the
``config.plan_cache_size`` (64) most recently used plans, and warns once per
graph when it has to drop one.

A plan captures the registered modules, parameters and buffers as objects.
Every call checks that they are still the same objects (a parameter or
submodule replaced, ``p.data = ...``, ``model.to(...)``, an optimizer
added); if not, the plans are dropped and the call compiles again.  Writes
into their memory (``optimizer.step()``, ``p.data.copy_(...)``,
``load_state_dict``) need no recompilation: plans read state live.

With an optimizer the graph runs forward, backward and the update in one go:
gradients are recomputed on every call (there is no ``zero_grad`` to forget)
and left in ``.grad`` as eager mode would leave them.
"""
import contextlib
import itertools
import math
import operator
import warnings

import numpy as np

from ..tensor import Tensor
from .module import Module

__all__ = ["Graph", "GraphConfig"]


class GraphConfig:
    """``graph.config``: compile options (OneFlow's names)."""

    EXECUTORS = ("actors", "sequential")

    def __init__(self):
        self.fuse_attention = False
        self.fuse_residual = True
        self.fuse_batch_norm_relu = False
        self.amp = False
        self.amp_dtype = None
        self.fuse_elementwise = True
        self.fuse_add_to_output = False
        self.fuse_model_update_ops = True
        self.in_place = True
        self.fuse_actor_chains = True
        self.kernel_plan = True
        self.cuda_graphs = True
        self.gradient_accumulation_steps = 1
        self.executor = "actors"
        self.plan_cache_size = 64

    def enable_amp(self, mode=True, *, dtype=None):
        """Mixed precision (OneFlow's ``enable_amp``): build() is traced under
        ``pyflow.autocast`` on every device type, with ``dtype`` (bfloat16 or
        float16; default autocast's own: bfloat16 on cpu, float16 on cuda), so
        the plan holds the casts autocast makes: matrix products and
        convolutions in ``dtype``, losses and every other op as the op lists of
        docs/amp.md say, parameters (the master weights) and their updates in
        float32.  The graph passes then remove casts that change nothing
        (``pyflow.graph.passes.casts``).  float16 training loses small
        gradients without a loss scaler: give the graph one with
        ``set_grad_scaler``."""
        if not isinstance(mode, bool):
            raise TypeError(f"enable_amp: mode must be a bool, got {type(mode).__name__}")
        if dtype is not None:
            from .. import dtypes as _dt
            given = dtype
            try:
                dtype = _dt.as_dtype(dtype)
            except (TypeError, ValueError):
                dtype = None
            if dtype not in (_dt.bfloat16, _dt.float16):
                raise TypeError(f"enable_amp: dtype must be pyflow.bfloat16 or pyflow.float16, "
                                f"got {given!r}")
        self.amp = mode
        self.amp_dtype = dtype

    def amp_context(self):
        """The autocast contexts build() is traced in (none when amp is off)."""
        from ..amp.autocast import DTYPES, autocast
        if not self.amp:
            return []
        return [autocast(dev, dtype=self.amp_dtype if self.amp_dtype in DTYPES[dev] else None)
                for dev in DTYPES]

    def allow_fuse_attention(self, mode=True):
        """Attention written as matmul, scale, masked_fill, softmax, matmul runs
        as one fused CPU kernel (pyflow.graph.passes.attention).  Off by
        default: the kernel stores no (B, H, T, S) scores, but on 2 AMD EPYC
        cores it was no faster than the chain at a small GPT's size and
        1.6-2.7x slower at T=128 (the chain's products run in BLAS)."""
        self.fuse_attention = bool(mode)

    def allow_fuse_residual(self, mode=True):
        """``dropout(x) + r`` runs as ``F.fused_bias_dropout_add`` and ``s = a +
        b`` then ``layer_norm(s)`` as ``F.fused_add_layer_norm`` (one kernel
        pass each; pyflow.graph.passes.residual), with the unfused ops' values.
        On by default: DLPerf's CPU presets' graph steps took 822-1141 ms
        against 887-1644 ms (GPT-2, 4 add+norms fused) and 876-951 against
        928-1061 ms (BERT, 1 add+norm and 4 dropout+adds), alternating runs on
        2 shared AMD EPYC cores."""
        self.fuse_residual = bool(mode)

    def allow_fuse_batch_norm_relu(self, mode=True):
        """``relu(batch_norm(x) + r)`` and ``relu(batch_norm(x))`` run as
        ``F.fused_batch_norm_add_relu`` (pyflow.graph.passes.residual).  Off by
        default: on 2 AMD EPYC cores DLPerf's ResNet-50 graph step was slower
        with it (379-454 ms against 300-352 ms)."""
        self.fuse_batch_norm_relu = bool(mode)

    def allow_fuse_elementwise(self, mode=True):
        """Chains of elementwise ops become one generated kernel (on by default)."""
        self.fuse_elementwise = bool(mode)

    def allow_fuse_add_to_output(self, mode=True):
        """``linear(x) + r`` adds ``r`` into the product's own buffer
        (pyflow.graph.passes.add_to_output); off by default, as in OneFlow."""
        self.fuse_add_to_output = bool(mode)

    def allow_fuse_model_update_ops(self, mode=True):
        """One multi-tensor update node (one kernel) per (optimizer, dtype,
        device) instead of one update node per parameter
        (pyflow.graph.passes.model_update).  On by default, unlike OneFlow:
        the fused node does the unfused nodes' arithmetic bit for bit, eager
        ``optimizer.step()`` runs the same multi-tensor kernels, and one node
        costs less than one per parameter (a small GPT's update 650 -> 280 us)."""
        self.fuse_model_update_ops = bool(mode)

    def allow_fuse_actor_chains(self, mode=True):
        """Each run of consecutive actors on one stream runs as one chain actor
        (pyflow.runtime.chains; on by default).  Off: one actor per op, to
        watch every register move in ``explain`` and the trace."""
        self.fuse_actor_chains = bool(mode)

    def allow_kernel_plan(self, mode=True):
        """Nodes whose ops have a kernel-level form run as plain kernel calls on
        arrays into buffers reused across steps, no Tensor, Function or autograd
        Context per op (pyflow.graph.kernel_plan; on by default).  Off: every
        node calls its op's Function on Tensors, as eager mode does."""
        self.kernel_plan = bool(mode)

    def allow_cuda_graphs(self, mode=True):
        """On one cuda device, each step's kernels are captured into CUDA graphs
        once and replayed after (pyflow.graph.cuda_graph; on by default, and
        part of the kernel-level plan, so off with it too).  Off: every kernel
        is launched from Python on every step."""
        self.cuda_graphs = bool(mode)

    def allow_in_place(self, mode=True):
        """Elementwise nodes write into an input that dies at them
        (pyflow.graph.passes.in_place); on by default."""
        self.in_place = bool(mode)

    def set_gradient_accumulation_steps(self, steps):
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"set_gradient_accumulation_steps: steps must be an int >= 1, "
                             f"got {steps!r}")
        self.gradient_accumulation_steps = steps

    def set_plan_cache_size(self, size):
        """Keep at most ``size`` compiled plans (one per input signature; 64 by
        default).  Compiling one more drops the least recently used, and the
        graph warns the first time it does: plans that keep being added mean an
        argument that changes on every call (a Python number that could be a
        tensor, a batch size)."""
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise ValueError(f"set_plan_cache_size: size must be an int >= 1, got {size!r}")
        self.plan_cache_size = size

    def set_executor(self, executor):
        """``"actors"`` (the default: pyflow.runtime, one thread per stream) or
        ``"sequential"`` (the nodes in order on the caller's thread)."""
        if executor not in self.EXECUTORS:
            raise ValueError(f"set_executor: executor must be one of {self.EXECUTORS}, "
                             f"got {executor!r}")
        self.executor = executor

    def __repr__(self):
        return (f"GraphConfig(gradient_accumulation_steps={self.gradient_accumulation_steps}, "
                f"executor={self.executor!r}, plan_cache_size={self.plan_cache_size})")


class Graph:
    """Subclass it, register modules as attributes, optionally
    ``add_optimizer``, and define ``build(*args)``."""

    def __init__(self):
        self.config = GraphConfig()
        self._optimizers = []
        self._grad_scaler = None
        self._plans = {}            # signature -> Plan, in the order they were compiled
        self._ticks = itertools.count()     # Plan.last_call: the LRU order
        self._captured = []         # the objects the plans captured (see _walk)
        self._evicted = 0           # plans dropped by the cache bound

    def build(self, *args):
        raise NotImplementedError(f"{type(self).__name__} must define build(self, *args), the "
                                  f"computation the graph compiles")

    def add_optimizer(self, optimizer, *, lr_sch=None):
        from ..optim import Optimizer
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"add_optimizer: expected a pyflow.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self._optimizers.append((optimizer, lr_sch))

    def set_grad_scaler(self, grad_scaler):
        """Dynamic loss scaling in the compiled step, as OneFlow's
        ``set_grad_scaler``: a ``pyflow.amp.GradScaler`` whose scale seeds the
        backward of ``loss.backward()`` (build() calls it unscaled), and whose
        ``step`` and ``update`` replace the optimizer's update nodes: gradients
        are unscaled and checked for inf/nan in one multi-tensor kernel, the
        update is skipped when any overflowed (``grad_scaler.last_step_skipped``),
        and the scale backs off or grows, exactly as the eager loop
        ``scaler.scale(loss).backward(); scaler.step(opt); scaler.update()``
        does.  For float16 training (``config.enable_amp(dtype=pyflow.float16)``)."""
        from ..amp import GradScaler
        if not isinstance(grad_scaler, GradScaler):
            raise TypeError(f"set_grad_scaler: expected a pyflow.amp.GradScaler, got "
                            f"{type(grad_scaler).__name__}")
        self._grad_scaler = grad_scaler
        self._plans.clear()             # the plans' backward seeds and updates change

    # ------------------------------------------------------------- compile
    def _modules(self):
        return [(k, v) for k, v in vars(self).items() if isinstance(v, Module)]

    def _state_names(self):
        names = {}
        for prefix, module in self._modules():
            for name, p in module.named_parameters(prefix):
                names.setdefault(id(p), name)
            for name, b in module.named_buffers(prefix):
                names.setdefault(id(b), name)
        return names

    def _walk(self):
        """(modes, captured) of the registered modules, in one walk of the tree.

        ``modes``: each module's ``training`` flag and each parameter's
        ``requires_grad``, part of a plan's signature (a graph that switches
        between train() and eval() keeps a plan for each).  ``captured``: the
        objects a trace takes by identity, the modules, their parameters and
        buffers and the arrays they hold, the graph's own tensor attributes and
        its optimizers.  Holding them keeps their ids from being reused, so
        "the same objects" is exact."""
        captured, todo = [], []
        for value in reversed(list(vars(self).values())):
            if isinstance(value, Module):
                todo.append(value)
            elif isinstance(value, Tensor):
                captured += (value, value._data)
        captured += self._optimizers
        # (extend with dict views and comprehensions: this runs on every call)
        modules, params, buffers, seen = [], [], [], set()
        while todo:
            m = todo.pop()
            if m is None or id(m) in seen:      # an empty slot, a module met twice, a cycle
                continue
            seen.add(id(m))
            modules.append(m)
            params += m._parameters.values()
            buffers += m._buffers.values()
            todo += m._modules.values()
        params = [p for p in params if p is not None]
        buffers = [b for b in buffers if b is not None]
        captured += modules
        captured += params
        captured += [p._data for p in params]
        captured += buffers
        captured += [b._data for b in buffers]
        modes = [m.training for m in modules]
        modes += [p.requires_grad for p in params]
        return tuple(modes), captured

    def _signature(self, args, modes=None):
        parts = []
        for a in args:
            if isinstance(a, Tensor):
                parts.append(("T", tuple(a.shape), a.dtype.name, str(a.device), a._placement,
                              a._sbp, a.requires_grad))
            else:
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(f"{type(self).__name__}(): non-tensor arguments must be "
                                    f"hashable (they are part of the compiled plan's key), got "
                                    f"{type(a).__name__}") from None
                parts.append(("V", type(a).__name__, _value_key(a)))
        if modes is None:
            modes = self._walk()[0]
        c = self.config
        return (tuple(parts), modes, c.gradient_accumulation_steps, c.executor,
                c.fuse_elementwise, c.fuse_add_to_output, c.fuse_model_update_ops, c.in_place,
                c.fuse_actor_chains, c.kernel_plan, c.cuda_graphs, c.fuse_attention, c.amp,
                c.amp_dtype, c.fuse_residual, c.fuse_batch_norm_relu)

    def compile(self, *args):
        """The Plan for ``args``' signature (compiling it if new)."""
        modes, captured = self._walk()
        old = self._captured
        if len(captured) != len(old) or not all(map(operator.is_, captured, old)):
            # a module, parameter, buffer or optimizer was replaced: every plan
            # captured the old objects, and would keep them alive
            self._plans.clear()
            self._captured = captured
        key = self._signature(args, modes)
        plan = self._plans.get(key)
        if plan is None:
            from ..graph.plan import compile_plan
            names = self._state_names()
            plan = compile_plan(self._build_traced(), args, names, self._optimizers,
                                self.config.gradient_accumulation_steps, self.config.executor,
                                self.config.fuse_elementwise, self.config.fuse_add_to_output,
                                self.config.fuse_model_update_ops, self.config.in_place,
                                self.config.fuse_actor_chains, self.config.kernel_plan,
                                self.config.cuda_graphs,
                                fuse_attention=self.config.fuse_attention,
                                grad_scaler=self._grad_scaler,
                                fuse_residual=self.config.fuse_residual,
                                fuse_batch_norm_relu=self.config.fuse_batch_norm_relu)
            self._check_unchanged_by_trace(captured, names)
            self._make_room()
            self._plans[key] = plan
        plan.last_call = next(self._ticks)
        return plan

    def _build_traced(self):
        """build(), inside the autocast contexts of ``config.enable_amp``."""
        contexts = self.config.amp_context()
        if not contexts:
            return self.build

        def build(*args):
            with contextlib.ExitStack() as stack:
                for c in contexts:
                    stack.enter_context(c)
                return self.build(*args)
        return build

    def _check_unchanged_by_trace(self, captured, names):
        """build() must not replace what the plan captured (``self.buf = ...`` in
        a forward): the graph would keep the old object, and every later call
        would find a changed module tree and compile again."""
        after = self._walk()[1]
        if len(after) == len(captured) and all(map(operator.is_, after, captured)):
            return
        from ..graph.tracer import TracingError
        new = sorted(name for i, name in self._state_names().items() if i not in names)
        what = f" ({', '.join(new)})" if new else ""
        raise TracingError(
            f"{type(self).__name__}: build() replaced a module, parameter or buffer{what} "
            f"while it was traced; a graph keeps the objects it captured.  Write into a "
            f"buffer in place (buf.copy_(new_value)) instead of assigning a new tensor")

    def _make_room(self):
        """Drop least recently used plans until one more fits the bound."""
        size = self.config.plan_cache_size
        while len(self._plans) >= size:
            del self._plans[min(self._plans, key=lambda k: self._plans[k].last_call)]
            self._evicted += 1
            if self._evicted == 1:
                warnings.warn(
                    f"{type(self).__name__}: more input signatures than its plan cache holds "
                    f"({size} plans); the least recently used plan was dropped, and is compiled "
                    f"again if its signature comes back.  A plan is compiled per signature "
                    f"(tensor shapes, dtypes, devices and requires_grad, non-tensor argument "
                    f"values, training flags): pass numbers that change on every call as "
                    f"tensors, or raise the bound with graph.config.set_plan_cache_size(n).  "
                    f"(Warned once per graph.)", RuntimeWarning, stacklevel=4)

    def __call__(self, *args):
        return self.compile(*args).run(args)

    def run_batches(self, batches, registers=2):
        """Run the graph once per batch of ``batches`` (an iterable of argument
        tuples, e.g. a DataLoader) as ONE pipelined actor run: the data stream
        loads batch i+1 while the compute stream runs batch i, with at most
        ``registers`` batches in flight per edge.  Results equal calling the
        graph batch by batch (parameter updates are fed forward by feedback
        edges).  Returns the list of build()'s outputs.  Every batch must match
        the first one's signature (use ``drop_last=True``).  Over global tensors
        the batches run one after another (collectives need one order)."""
        from ..graph.lowering import run_stream
        if not isinstance(registers, int) or registers < 1:
            raise ValueError(f"run_batches: registers must be an int >= 1, got {registers!r}")
        if self.config.gradient_accumulation_steps != 1:
            raise ValueError("run_batches: gradient accumulation is not supported in a "
                             "pipelined run; call the graph once per batch instead")
        it = iter(batches)
        try:
            first = next(it)
        except StopIteration:
            return []
        first = first if isinstance(first, (tuple, list)) else (first,)
        plan = self.compile(*first)
        if getattr(plan.graph, "is_global", False) or plan.graph.input_writes:
            # Collectives must be posted in one order on every rank; overlapping
            # iterations would let timing decide it.  And an input that build()
            # writes in place is written back after its own run.  Run the batches
            # one by one.
            return [self(*first)] + [self(*(b if isinstance(b, (tuple, list)) else (b,)))
                                     for b in it]

        def signature(batch):
            return self._signature(batch)
        signature.expected = self._signature(first)

        def chained():
            yield first
            yield from it
        return run_stream(plan, chained(), registers, signature)

    # ------------------------------------------------------------- watching
    @property
    def plans(self):
        """The cached compiled plans, one per input signature, oldest first."""
        return list(self._plans.values())

    def __repr__(self):
        lines = [f"{type(self).__name__}(config={self.config!r}, plans={len(self._plans)})"]
        for name, module in self._modules():
            lines.append(f"  ({name}): {type(module).__name__}")
        return "\n".join(lines)

    def __str__(self):
        """``print(graph)``: the compiled plans explained (pyflow.explain)."""
        from ..graph.explain import explain
        return repr(self) + "\n" + explain(self)

    def to_dot(self, path, kind="logical", plan=0):
        """Write Graphviz text of compiled plan ``plan``: ``kind="logical"`` (the
        IR after all passes) or ``"task"`` (the actors and register edges)."""
        if not self._plans:
            raise RuntimeError("to_dot: the graph is not compiled yet; call it once first")
        if kind not in ("logical", "task"):
            raise ValueError(f"to_dot: kind must be 'logical' or 'task', got {kind!r}")
        p = self.plans[plan]
        if kind == "logical":
            from ..graph.explain import logical_dot
            text = logical_dot(p.graph)
        else:
            text = p.task_graph[0].to_dot()
        with open(path, "w") as f:
            f.write(text)
        return path


class _Key:
    """A plan-key stand-in for a float that ``==`` would misjudge."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


_NAN = _Key("nan")               # nan != nan: every call would compile a new plan
_NEGATIVE_ZERO = _Key("-0.0")    # -0.0 == 0.0, but build() may divide by it


def _value_key(a):
    """A non-tensor argument as part of a plan's key: equal keys when build()
    sees the same value (and, inside tuples, the same type)."""
    if isinstance(a, (float, np.floating)):
        if a != a:
            return _NAN
        if a == 0.0 and math.copysign(1.0, a) < 0:
            return _NEGATIVE_ZERO
        return a
    if isinstance(a, (complex, np.complexfloating)):
        return ("complex", _value_key(a.real), _value_key(a.imag))
    if isinstance(a, tuple):
        return tuple((type(x).__name__, _value_key(x)) for x in a)
    return a
