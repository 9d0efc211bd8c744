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

The first call with a new input signature (shapes, dtypes, devices, the
``training`` flags of the registered modules, non-tensor arguments) traces
``build`` and compiles a plan (``pyflow.graph.plan``); later calls with the same
signature run it.  A new signature compiles and caches another plan, so a
different batch size never crashes or silently reuses a wrong plan.

With an optimizer the graph runs forward, backward and the update in one go:
gradients are recomputed on every call (there is no ``zero_grad`` to forget)
and left in ``.grad`` as eager mode would leave them.
"""
from ..tensor import Tensor
from .module import Module

__all__ = ["Graph", "GraphConfig"]


class GraphConfig:
    """``graph.config``: compile options (OneFlow's names)."""

    EXECUTORS = ("actors", "sequential")

    def __init__(self):
        self.fuse_elementwise = True
        self.fuse_add_to_output = False
        self.fuse_model_update_ops = False
        self.in_place = True
        self.fuse_actor_chains = True
        self.gradient_accumulation_steps = 1
        self.executor = "actors"

    def enable_amp(self, mode=True):
        if mode:
            raise NotImplementedError(
                "graph.config.enable_amp(True): mixed precision arrives with pyflow's AMP "
                "support (a later issue); graphs run in the tensors' own dtypes until then")

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
        (pyflow.graph.passes.model_update); off by default, as in OneFlow."""
        self.fuse_model_update_ops = bool(mode)

    def allow_fuse_actor_chains(self, mode=True):
        """Each run of consecutive actors on one stream runs as one chain actor
        (pyflow.runtime.chains; on by default).  Off: one actor per op, to
        watch every register move in ``explain`` and the trace."""
        self.fuse_actor_chains = bool(mode)

    def allow_in_place(self, mode=True):
        """Elementwise nodes write into an input that dies at them
        (pyflow.graph.passes.in_place); on by default."""
        self.in_place = bool(mode)

    def set_gradient_accumulation_steps(self, steps):
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"set_gradient_accumulation_steps: steps must be an int >= 1, "
                             f"got {steps!r}")
        self.gradient_accumulation_steps = steps

    def set_executor(self, executor):
        """``"actors"`` (the default: pyflow.runtime, one thread per stream) or
        ``"sequential"`` (the nodes in order on the caller's thread)."""
        if executor not in self.EXECUTORS:
            raise ValueError(f"set_executor: executor must be one of {self.EXECUTORS}, "
                             f"got {executor!r}")
        self.executor = executor

    def __repr__(self):
        return (f"GraphConfig(gradient_accumulation_steps={self.gradient_accumulation_steps}, "
                f"executor={self.executor!r})")


class Graph:
    """Subclass it, register modules as attributes, optionally
    ``add_optimizer``, and define ``build(*args)``."""

    def __init__(self):
        self.config = GraphConfig()
        self._optimizers = []
        self._plans = {}

    def build(self, *args):
        raise NotImplementedError(f"{type(self).__name__} must define build(self, *args), the "
                                  f"computation the graph compiles")

    def add_optimizer(self, optimizer, *, lr_sch=None):
        from ..optim import Optimizer
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"add_optimizer: expected a pyflow.optim.Optimizer, got "
                            f"{type(optimizer).__name__}")
        self._optimizers.append((optimizer, lr_sch))

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

    def _signature(self, args):
        parts = []
        for a in args:
            if isinstance(a, Tensor):
                parts.append(("T", tuple(a.shape), a.dtype.name, str(a.device), a._placement,
                              a._sbp))
            else:
                try:
                    hash(a)
                except TypeError:
                    raise TypeError(f"{type(self).__name__}(): non-tensor arguments must be "
                                    f"hashable (they are part of the compiled plan's key), got "
                                    f"{type(a).__name__}") from None
                parts.append(("V", type(a).__name__, a))
        modes = tuple(m.training for _, top in self._modules() for m in top.modules())
        c = self.config
        return (tuple(parts), modes, c.gradient_accumulation_steps, c.executor,
                c.fuse_elementwise, c.fuse_add_to_output, c.fuse_model_update_ops, c.in_place,
                c.fuse_actor_chains)

    def compile(self, *args):
        """The Plan for ``args``' signature (compiling it if new)."""
        key = self._signature(args)
        plan = self._plans.get(key)
        if plan is None:
            from ..graph.plan import compile_plan
            plan = compile_plan(self.build, args, self._state_names(), self._optimizers,
                                self.config.gradient_accumulation_steps, self.config.executor,
                                self.config.fuse_elementwise, self.config.fuse_add_to_output,
                                self.config.fuse_model_update_ops, self.config.in_place,
                                self.config.fuse_actor_chains)
            self._plans[key] = plan
        return plan

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
        if getattr(plan.graph, "is_global", False):
            # Collectives must be posted in one order on every rank; overlapping
            # iterations would let timing decide it.  Run the batches one by one.
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
        """The compiled plans, one per input signature."""
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

