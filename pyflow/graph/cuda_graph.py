"""One CUDA graph per step: a compiled step's device work captured once, replayed after.

A kernel-level plan (``kernel_plan.py``) calls its kernels from straight-line
Python, but on a GPU every launch still costs host time (numba's dispatcher,
argument packing), and a small model's step is hundreds of launches.  CUDA's
answer is stream capture: record the launches of a step once into a graph,
then replay the whole graph with one call.  OneFlow and PyTorch both do it
(``torch.cuda.graphs``); here it is on by default for graphs whose nodes live
on one cuda device (``graph.config.allow_cuda_graphs(False)`` opts out).

**What is captured.**  ``segments`` walks the plan's steps in order and groups
the runs of *capturable* steps: ``call``, ``fn`` and ``backward`` nodes whose
tensors are all local on the cuda device (a backward only when its forward was
captured too: it reads the forward's saved arrays).  Everything else splits
the step and runs as Python each time: seeds (a new one per step, which a
graph would freeze), ``assign`` / ``set_grad`` / ``update`` (Python state:
``.grad``, version counters, the optimizer's step count and learning rate on
the host), boxing and other MPI calls, host tensors, and ops that declare
``reads_on_host`` (their forward checks device data on the host: the bounds
checks of class targets and embedding indices, a loss's mean denominator).
Any other node that turns out to read device data on the host while
capturing makes the backend refuse the capture; it is then marked host-only,
the segment runs uncaptured that once, and the next step is cut again
without it, its segments capturing at once (``explain`` lists such nodes).

**How a segment runs** (``Segment``): its first call runs its steps as plain
Python (warm-up: kernels compile, lazy state settles); the second copies its
inputs into buffers of its own, captures its steps on the backend's capture
stream and launches the graph; later calls copy the new inputs into those
same buffers (a device copy each, skipped for values that come from another
captured segment: those are the same arrays every step) and launch the graph.
A graph reads and writes the same memory on every replay, so its outputs
are overwritten by the next step: outputs the caller keeps (the graph's
results; gradients when micro-batches accumulate) are copied out, while a
parameter's ``.grad`` is the graph's own buffer, as with PyTorch's CUDA graphs.

**Where it runs.**  On a GPU: CuPy's stream capture (``pyflow/device.py``).
Under numba's simulator: ``pyflow/_simcapture.py``, a recording with the same
rules (host reads refused, work recorded and not run while capturing, replayed
into the captured arrays), so the simulator tests check that captured and
uncaptured steps give the same numbers.  On the cpu device there is no
stream to capture: the plan runs as it did (``segments`` is not used).
"""
import traceback

from ..device import backend_of
from ..runtime.chains import ChainMemberError
from ..tensor import Tensor

CAPTURED_KINDS = frozenset({"call", "fn", "backward"})


def capture_device(graph):
    """The cuda device type when every tensor Value of ``graph`` that a node
    makes is local on a cuda device, else None (no CUDA graph for it)."""
    kinds = set()
    for node in graph.nodes:
        for v in node.outputs:
            if v.device is not None:
                if v.placement is not None:
                    return None
                kinds.add(v.device.type)
    return "cuda" if kinds == {"cuda"} else None


def capturable(ks, captured_forwards, refused):
    """True when kernel step ``ks`` may run inside a captured segment."""
    node = ks.node
    if node.kind not in CAPTURED_KINDS or node.id in refused:
        return False
    if node.kind != "backward" and getattr(node.target, "reads_on_host", False):
        return False                # declared by the op: it checks device data on the host
    if ks.wants_ctx and node.attrs["forward"] not in captured_forwards:
        return False
    values = list(ks.feeds) + list(node.outputs)
    return all(v.placement is None and v.device is not None and v.device.type == "cuda"
               for v in values)


def segments(graph, ksteps, refused, backend, on_refused, copy_keys=(), warm=False):
    """``ksteps`` with every run of capturable steps replaced by one Segment.
    ``refused``: ids of nodes found to be uncapturable; ``on_refused(node, exc)``
    is told of a new one; ``copy_keys``: values read after the step that a
    Segment must hand out as fresh copies; ``warm``: the steps have run before
    (the segments capture on their first call)."""
    runs, run, captured_forwards = [], [], set()
    for ks in ksteps:
        if capturable(ks, captured_forwards, refused):
            run.append(ks)
            if ks.emits_ctx:
                captured_forwards.add(ks.node.id)
            continue
        if run:
            runs.append(run)
            run = []
        runs.append(ks)
    if run:
        runs.append(run)

    kind_of = {v.id: "tensor" for v in graph.inputs}     # how each value reaches a segment
    read_after = [set() for _ in runs]       # keys read by the units after each one
    later = {v.id for v in graph.output_values()} | set(copy_keys)
    for i in range(len(runs) - 1, -1, -1):
        read_after[i] = set(later)
        for ks in runs[i] if isinstance(runs[i], list) else [runs[i]]:
            later.update(ks.reads)
    keep = set(copy_keys) | {v.id for v in graph.output_values()}
    units = []
    for i, item in enumerate(runs):
        if not isinstance(item, list):
            units.append(item)
            for key in item.writes:
                kind_of[key] = "array"
            continue
        made, reads, writes = set(), [], []
        for ks in item:
            reads += [k for k in ks.reads if k not in made and k not in reads]
            made.update(ks.writes)
            writes += [k for k in ks.writes if k in read_after[i]]
        seg = Segment(item, reads, [kind_of[k] for k in reads], writes,
                      [k in keep for k in writes], backend, on_refused, warm)
        for key in writes:
            kind_of[key] = "static"
        units.append(seg)
    return units


class Segment:
    """Consecutive capturable kernel steps run as one CUDA graph (see the module
    docstring).  It looks like a kernel step to ``sequential_function``: a
    ``name``, the keys it ``reads`` and ``writes``, and ``actor_fn``."""

    def __init__(self, members, reads, kinds, writes, copies, backend, on_refused, warm=False):
        self.members = members
        self.name = f"cuda graph {members[0].name}..{members[-1].name}"
        self.reads, self.kinds, self.writes = reads, kinds, writes
        self.copies = copies                # per write: hand out a fresh copy
        self.backend, self.on_refused = backend, on_refused
        self.calls = 1 if warm else 0
        self.graph = None
        self.static_in = None               # per read: the buffer the graph reads (or None)
        self.static_out = None

    @property
    def node(self):
        return self.members[0].node

    @property
    def actor_fn(self):
        """The segment itself: called with the values it reads, it returns None,
        one value or a tuple, as an actor's function does.  (Not a closure over
        the segment: that would be a reference cycle keeping a dropped segment's
        graph and buffers until the garbage collector runs.)"""
        return self

    def __call__(self, *values):
        self.calls += 1
        if self.graph is not None:
            outs = self._replay(values)
        elif self.calls == 1:
            outs = self._run(values)
        else:
            outs = self._capture(values)
        n = len(outs)
        return None if n == 0 else outs[0] if n == 1 else tuple(outs)

    def _run(self, values, wrap=True):
        env = dict(zip(self.reads, values))
        for m in self.members:
            self.at = m
            try:
                res = m.actor_fn(*[env[k] for k in m.reads])
            except Exception as exc:
                if not wrap:
                    raise
                raise ChainMemberError(m.name, exc) from exc     # names the op, not the segment
            if len(m.writes) == 1:
                env[m.writes[0]] = res
            elif m.writes:
                env.update(zip(m.writes, res))
        return [env[k] for k in self.writes]

    def _capture(self, values):
        xp = self.backend.xp
        static_in, fed = [], []
        for v, kind in zip(values, self.kinds):
            if kind == "static":
                static_in.append(None)
                fed.append(v)
                continue
            buf = xp.array(v._data if kind == "tensor" else v, copy=True)
            static_in.append(buf)
            fed.append(Tensor._make(buf, v.dtype, v.device) if kind == "tensor" else buf)
        self.backend.begin_capture()
        try:
            outs = self._run(fed, wrap=False)
        except Exception as exc:
            try:
                self.backend.end_capture()
            except Exception:       # noqa: BLE001 (an invalidated capture ends with an error)
                pass
            if not self.backend.capture_failed(exc):
                raise ChainMemberError(self.at.name, exc) from exc
            # the frames of the refused capture hold its arrays and tensors in
            # cycles through the exception: free them now, not at the next gc
            traceback.clear_frames(exc.__traceback__)
            self.on_refused(self.at.node, exc)
            return self._run(values)
        self.graph = self.backend.end_capture()
        self.static_in, self.static_out = static_in, outs
        self.graph.launch()
        return self._handed_out()

    def _replay(self, values):
        for v, kind, buf in zip(values, self.kinds, self.static_in):
            if buf is not None:
                buf[...] = v._data if kind == "tensor" else v
        self.graph.launch()
        return self._handed_out()

    def _handed_out(self):
        xp = self.backend.xp
        return [xp.array(o, copy=True) if copy else o
                for o, copy in zip(self.static_out, self.copies)]


def captured_units(plan, ksteps):
    """The plan's kernel steps as ``segments`` cut them on the plan's device
    backend (None when the plan's graph is not on one cuda device or the
    backend cannot capture)."""
    device = capture_device(plan.graph)
    if device is None:
        return None
    backend = backend_of(device)
    if backend.capture_unavailable() is not None:
        return None
    copy_keys = set()
    if plan.accumulation > 1:       # each micro-batch's gradients are kept until summed
        for ks in ksteps:
            if ks.node.kind == "set_grad":
                copy_keys.update(ks.reads)
    return segments(plan.graph, ksteps, plan.refused_capture, backend,
                    plan.refuse_capture, copy_keys, warm=bool(plan.refused_capture))


def summary(plan):
    """What ``explain`` says about the CUDA graphs of the plan's step."""
    units = plan.captured_units()
    if units is None:
        why = ("off (graph.config.allow_cuda_graphs(False))" if not plan.cuda_graphs else
               "not used: the step's tensors are not all local on one cuda device"
               if capture_device(plan.graph) is None else
               f"not used: {backend_of('cuda').capture_unavailable()}")
        return f"cuda graphs: {why}"
    segs = [u for u in units if isinstance(u, Segment)]
    inside = sum(len(s.members) for s in segs)
    text = (f"cuda graphs: {len(segs)} captured segment(s) holding {inside} of "
            f"{len(units) - len(segs) + inside} nodes; the rest run as Python every step")
    if plan.refused_capture:
        text += ("\n  refused while capturing (they read device data on the host): " +
                 ", ".join(plan.refused_capture.values()))
    return text
