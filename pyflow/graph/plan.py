"""A compiled plan: the passes applied to one trace, ready to run.

``compile_plan`` traces ``build`` on the first inputs of a signature, runs
the passes in order

    trace -> fuse_attention -> fuse_elementwise -> fuse_add_to_output -> insert_boxing -> autograd
          -> accumulate_slice_grads -> optimizer -> fuse_model_update
          -> constant_folding -> dead_code_elimination -> in_place -> plan_memory

and keeps every intermediate Graph (``plan.stages``) so ``explain`` can show
what each pass changed.  ``Plan.run`` executes one call: the micro-batches
of gradient accumulation one after another (gradients summed), then the
optimizer update, and writes back the inputs build() wrote in place.
"""
from ..autograd import no_grad
from ..ops.creation import zeros
from ..ops.join import cat
from ..tensor import Tensor
from . import passes
from . import cuda_graph as _cuda_graph
from . import kernel_plan as _kernel
from .executor import make_steps, run_sequential
from .ir import Node
from .tracer import trace


class Plan:
    def __init__(self, stages, accumulation, executor, fuse_actor_chains=True, kernel_plan=True,
                 cuda_graphs=True):
        self.stages = stages                  # [(pass name, Graph)], the last is run
        self.graph = stages[-1][1]
        self.accumulation = accumulation
        self.executor = executor
        self.fuse_actor_chains = fuse_actor_chains   # lowering merges a stream's runs
        self.steps = make_steps(self.graph)
        self.kernel_plan = kernel_plan        # run lowered kernels on arrays (kernel_plan.py)
        self._kernel_steps = {}               # pool -> (KernelSteps, buffer bytes)
        self._sequential = None
        self._task_graph = None
        self.cuda_graphs = cuda_graphs and kernel_plan   # capture the step (cuda_graph.py)
        self.refused_capture = {}             # node id -> name: found to read device data
        self._units = False                   # captured_units(), built on first use
        # parameters whose .grad the graph recomputes on every call
        self._grads = [s.node.target for s in self.steps
                       if s.kind == "set_grad" and "input" not in s.node.attrs]
        # positions (among the tensor arguments) of inputs whose .grad it computes
        self._input_grads = [i for i, v in enumerate(self.graph.inputs) if v.requires_grad]
        # data parallel's bucketed gradient all-reduce (executor.GradSync), if any
        self.grad_sync = next((s.grad_sync for s in self.steps if s.grad_sync), None)
        self.last_call = 0          # when nn.Graph last ran it (its cache drops the oldest)

    def kernel_steps(self, pool=True):
        """The nodes lowered to kernels on arrays (kernel_plan.py); ``pool``:
        lowered forwards write into buffers reused across steps."""
        if pool not in self._kernel_steps:
            self._kernel_steps[pool] = _kernel.kernel_steps(self.graph, self.steps, pool)
        return self._kernel_steps[pool][0]

    @property
    def buffer_bytes(self):
        """Bytes of the buffers the running kernel-level plan reuses across steps."""
        return max((b for _, b in self._kernel_steps.values()), default=0)

    def sequential_function(self):
        """The sequential executor's straight-line function (built on first use):
        over the kernel steps, or over CUDA-graph segments where they are used."""
        if self._sequential is None:
            units = self.captured_units() or self.kernel_steps(True)
            self._sequential = _kernel.sequential_function(self.graph, units)
        return self._sequential

    def captured_units(self):
        """The kernel steps cut into CUDA-graph segments (cuda_graph.py), or None
        where the step is not captured (cuda graphs off, not on one cuda device)."""
        if self._units is False:
            self._units = _cuda_graph.captured_units(self, self.kernel_steps(True)) \
                if self.cuda_graphs else None
        return self._units

    def refuse_capture(self, node, exc):
        """``node`` read device data on the host while capturing: the next run
        cuts the step again with it outside the graphs."""
        self.refused_capture[node.id] = node.name
        self._units = False
        self._sequential = None

    def runnable_steps(self, streaming=False):
        """What lowering turns into actors: the kernel-level steps (with buffers
        only where the nodes will run in graph order, one iteration at a time:
        one chain actor) or, with kernel plans off, the Tensor-level steps."""
        if not self.kernel_plan:
            return self.steps
        return self.kernel_steps(pool=self.fuse_actor_chains)

    @property
    def task_graph(self):
        """The actor task graph of one micro-batch (built on first use)."""
        if self._task_graph is None:
            from .lowering import lower, one_chain
            tg = lower(self.graph, self.runnable_steps(), chains=self.fuse_actor_chains)
            if self.kernel_plan and self.fuse_actor_chains and not one_chain(tg[0]):
                tg = lower(self.graph, self.kernel_steps(pool=False), chains=True)
            self._task_graph = tg
        return self._task_graph

    def _run_once(self, inputs):
        # a captured step runs in order on this thread: on one device and one
        # stream, the actor runtime would run it as one chain inline anyway
        if self.kernel_plan and (self.executor == "sequential" or self.captured_units()):
            out = _kernel.run_sequential(self, inputs, as_actor_error=self.executor == "actors")
        elif self.executor == "sequential":
            out = run_sequential(self.graph, self.steps, inputs, self.graph.memory.release)
        else:
            from .lowering import run_actors
            out = run_actors(self, inputs)
        writes = self.graph.input_writes
        if writes:
            # the inputs build() wrote in place take their last values, now that the
            # whole run (backward included) has read the old ones
            out, finals = out
            for i, value in zip(writes, finals):
                x = inputs[i]
                x._data[...] = value._data
                x._version[0] += 1
        return out

    def run(self, inputs):
        n = self.accumulation
        tensors = [x for x in inputs if isinstance(x, Tensor)]
        for p in self._grads:       # the last call's gradients are replaced, not read:
            p.grad = None           # free them now (eager's zero_grad), not at set_grad
        if n == 1:
            out = self._run_once(tensors)
        else:
            with no_grad():         # views of the caller's tensors, out of autograd
                chunks = [x.chunk(n, 0) for x in tensors]
            outs = []
            for k in range(n):
                for s in self.steps:
                    s.accumulate = k > 0            # set_grad adds to the earlier micro-batches'
                    s.skip_update = k < n - 1       # the optimizer steps after the last one
                outs.append(self._run_once([c[k] for c in chunks]))
            out = _combine(outs)
            for i in self._input_grads:     # each micro-batch's input gradient, as one
                _accumulate_grad(tensors[i], [c.grad for c in chunks[i]])
        if self.grad_sync is not None:    # a graph without an optimizer: reduce grads now
            self.grad_sync.flush()
        return out


def _accumulate_grad(x, parts):
    """Add the micro-batches' gradients ``parts`` (None where none reached
    that micro-batch), along dim 0, to ``x.grad`` as eager's backward would."""
    if all(g is None for g in parts):
        return
    size = x.shape[0] // len(parts)
    parts = [g if g is not None else zeros((size,) + tuple(x.shape[1:]), dtype=x.dtype,
                                           device=x.device) for g in parts]
    g = cat(parts, 0)
    x.grad = g if x.grad is None else x.grad + g


def _combine(outs):
    """Outputs of the micro-batches as one: scalars averaged (a mean loss stays
    the full batch's mean), other tensors concatenated along dim 0."""
    first = outs[0]
    if isinstance(first, Tensor):
        if first.ndim == 0:
            total = first
            for o in outs[1:]:
                total = total + o
            return total / len(outs)
        return cat(outs, 0)
    if isinstance(first, (list, tuple)):
        return type(first)(_combine([o[i] for o in outs]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: _combine([o[k] for o in outs]) for k in first}
    return first


def split_for_accumulation(inputs, n):
    """The first micro-batch of each tensor input (the trace's shapes)."""
    out = []
    for i, x in enumerate(inputs):
        if isinstance(x, Tensor) and n > 1:
            if x.ndim == 0 or x.shape[0] % n:
                raise ValueError(
                    f"gradient accumulation of {n} steps splits every tensor input along dim 0; "
                    f"input {i} has shape {tuple(x.shape)}, whose dim 0 is not a multiple of {n}")
            x = x.chunk(n, 0)[0]
        out.append(x)
    return out


def compile_plan(build, inputs, state_names, optimizers=(), accumulation=1,
                 executor="actors", fuse_elementwise=True, fuse_add_to_output=False,
                 fuse_model_update=False, in_place=True, fuse_actor_chains=True, kernel_plan=True,
                 cuda_graphs=True, fuse_attention=True, grad_scaler=None, fuse_residual=True,
                 fuse_batch_norm_relu=False):
    """Trace ``build`` and return the Plan for this input signature.  (The trace
    draws from private copies of the generators: it shifts no random stream.)
    With a ``grad_scaler`` the backward is seeded with its scale, read at run
    time, and its ``step``/``update`` do the optimizers' updates."""
    if grad_scaler is not None and not optimizers:
        raise RuntimeError("set_grad_scaler: the graph has no optimizer (add_optimizer) for "
                           "the scaler to step")
    graph = trace(build, split_for_accumulation(inputs, accumulation), state_names)
    if optimizers and graph.backward is None:
        raise RuntimeError("the graph has an optimizer (add_optimizer) but build() never calls "
                           "loss.backward()")
    loss_scale = 1.0 / accumulation if grad_scaler is None else \
        passes.LossScale(grad_scaler, accumulation)
    stages = [("trace", graph)]
    for name, run in (("remove_redundant_casts", passes.remove_redundant_casts),
                      ("fuse_attention", passes.fuse_attention if fuse_attention
                       else _skipped("fuse_attention")),
                      ("fuse_residual", passes.fuse_residual if fuse_residual
                       else _skipped("fuse_residual")),
                      ("fuse_batch_norm_relu", passes.fuse_batch_norm_relu
                       if fuse_batch_norm_relu else _skipped("fuse_batch_norm_relu")),
                      ("fuse_elementwise", passes.fuse_elementwise if fuse_elementwise
                       else _skipped("fuse_elementwise")),
                      ("fuse_add_to_output", passes.fuse_add_to_output if fuse_add_to_output
                       else _skipped("fuse_add_to_output")),
                      ("insert_boxing", passes.insert_boxing),
                      ("autograd", lambda g: passes.autograd(g, loss_scale)),
                      ("accumulate_slice_grads", passes.accumulate_slice_grads),
                      ("optimizer", lambda g: passes.add_update(g, optimizers, grad_scaler)),
                      ("fuse_model_update", passes.fuse_model_update if fuse_model_update
                       else _skipped("fuse_model_update")),
                      ("constant_folding", passes.constant_folding),
                      ("dead_code_elimination", passes.dead_code_elimination),
                      ("in_place", passes.in_place if in_place else _skipped("in_place")),
                      ("plan_memory", passes.plan_memory)):
        graph = run(graph)
        stages.append((name, graph))
    return Plan(stages, accumulation, executor, fuse_actor_chains, kernel_plan, cuda_graphs)


def _skipped(name):
    def skip(graph):
        g = graph.copy()
        g.history.append((name, "off (graph.config)"))
        return g
    return skip


__all__ = ["Plan", "compile_plan", "Node"]
