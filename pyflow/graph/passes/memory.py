"""Memory planning: liveness of every Value, release points, peak bytes, and
which buffers could be shared.

A node that ``passes.in_place`` lets write into a dying input allocates
nothing: its result takes over that input's buffer (and its bytes).

Each Value is born when its node runs and dies after its last reader.  The
executors drop their reference right there (``release``), so the allocator
(glibc malloc with pyflow's thresholds on the CPU, CuPy's pool on a GPU) hands
the same memory to the next op: that is where buffer reuse happens, because
pyflow's kernels allocate their own outputs.  The plan also assigns Values to
``buffers`` greedily (a Value may take a dead Value's buffer of at least its
size) to report what an arena would need.  Bytes held by autograd contexts
(saved activations) are counted through the Values a forward node reads, which
stay alive until its backward node runs.

Which of them, exactly: a forward node's autograd context keeps what its
``Function.forward`` chose to keep (``save_for_backward`` or attributes), no
more, and eager mode keeps the same.  ``contexts`` finds out at compile time
by running each such forward once on stand-in tensors (zeros of the Values'
shapes; parameters as they are) and looking at what the context holds: which
input and output Values (by the memory they view), and how many bytes of
other arrays (LayerNorm's statistics, a dropout mask).  Those Values live
until the backward node, the other bytes count from the forward to the
backward, and everything else dies at its last reader, as in eager mode.  A
forward that cannot be probed (random ops, ops recorded whole) keeps all its
inputs and outputs, the safe assumption.
"""
import warnings
import weakref
from dataclasses import dataclass

import numpy as np


@dataclass
class MemoryPlan:
    release: list          # per node: Value ids whose last reader it is
    peak_bytes: int        # most bytes alive at once (with release at last use)
    total_bytes: int       # sum over all Values (no reuse at all)
    arena_bytes: int       # the greedy shared-buffer assignment's size
    buffers: dict          # Value id -> buffer index

    def summary(self):
        return (f"peak {_human(self.peak_bytes)} live, {_human(self.arena_bytes)} in "
                f"{len(set(self.buffers.values()))} shared buffers, "
                f"{_human(self.total_bytes)} without reuse")


def _human(n):
    for unit in ("B", "KiB", "MiB"):
        if n < 1024 or unit == "MiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


# ------------------------------------------------------------------ what contexts keep
_probed = weakref.WeakKeyDictionary()      # call Node -> contexts()'s entry


def _root(arr):
    while isinstance(getattr(arr, "base", None), np.ndarray):
        arr = arr.base
    return arr


def _held_arrays(obj, out, depth=0):
    """The root arrays of every Tensor in ``obj`` (a context's attributes)."""
    from ...tensor import Tensor
    if isinstance(obj, Tensor):
        out[id(_root(obj._data))] = _root(obj._data)
        if obj._base is not None:
            _held_arrays(obj._base, out, depth)
    elif isinstance(obj, np.ndarray):
        out[id(_root(obj))] = _root(obj)
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for o in obj:
            _held_arrays(o, out, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for o in obj.values():
            _held_arrays(o, out, depth + 1)
    return out


def _probe(node):
    """(ids of the node's input/output Values its context keeps, bytes of the
    other arrays it keeps, {output id: input id it is a view of}), from one
    run of its forward on stand-ins."""
    from ... import autograd, ops
    from ..ir import substitute
    stand_in = {}

    def lookup(v):
        if v.kind in ("state", "const"):
            return v.tensor
        t = stand_in.get(v.id)
        if t is None:
            t = stand_in[v.id] = ops.zeros(v.shape, dtype=v.dtype, device=v.device)
        return t
    args, kwargs = substitute((node.args, node.kwargs), lookup)
    ctx = autograd.Context()
    # The stand-ins are zeros: 0 / 0 and log(0) here say nothing about the real
    # run.  errstate covers this thread; the warnings filter also covers the
    # threads of numba's CUDA simulator, which run the kernels there.
    with autograd.no_grad(), np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        out = node.target.forward(ctx, *args, **kwargs)
    outs = out if type(out) is tuple else (out,)
    held = _held_arrays([t for t, _ in ctx._saved] + list(vars(ctx).values()), {})
    kept, mine = set(), set()
    for v in node.inputs:
        r = id(_root(lookup(v)._data))
        mine.add(r)
        if r in held and v.kind in ("input", "node"):
            kept.add(v.id)
    for v, o in zip(node.outputs, outs):
        r = id(_root(o._data))
        mine.add(r)
        if r in held:
            kept.add(v.id)
    other = sum(a.nbytes for k, a in held.items() if k not in mine)
    roots = {id(_root(lookup(v)._data)): v.id for v in node.inputs}
    aliases = {v.id: roots[id(_root(o._data))] for v, o in zip(node.outputs, outs)
               if id(_root(o._data)) in roots}
    return kept, other, aliases


def contexts(graph):
    """{call node id: (Value ids its context keeps, bytes of other arrays it
    keeps, {output Value id: input Value id whose memory it views})} for the
    ``call`` nodes that could be probed (see the module docstring)."""
    out = {}
    for node in graph.nodes:
        if node.kind != "call" or node.attrs.get("random"):
            continue
        if node not in _probed:
            try:
                _probed[node] = _probe(node)
            except Exception:       # noqa: BLE001  (a stand-in it refuses: keep everything)
                _probed[node] = None
        if _probed[node] is not None:
            out[node.id] = _probed[node]
    return out


def liveness(graph, kept=None):
    """{value id: index of its last reader}, where a forward's Values that its
    context keeps (all its inputs and outputs where unknown) live until its
    backward node.  ``kept`` is ``contexts(graph)``, computed if not given."""
    kept = contexts(graph) if kept is None else kept
    index = {n.id: i for i, n in enumerate(graph.nodes)}
    last = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[v.id] = i
        if node.kind == "backward":        # what the forward's ctx keeps lives until here
            fwd = graph.nodes[index[node.attrs["forward"]]]
            probed = kept.get(fwd.id)
            for v in fwd.inputs + fwd.outputs:
                if probed is None or v.id in probed[0]:
                    last[v.id] = max(last.get(v.id, i), i)
    return last


def plan_memory(graph):
    """IR -> IR: the same graph with ``graph.memory`` set."""
    kept = contexts(graph)
    last = liveness(graph, kept)
    index = {n.id: i for i, n in enumerate(graph.nodes)}
    extra = [0] * len(graph.nodes)          # other bytes contexts keep, born / dying here
    for node in graph.nodes:
        if node.kind == "backward" and node.attrs["forward"] in kept:
            b = kept[node.attrs["forward"]][1]
            extra[index[node.attrs["forward"]]] += b
            extra[index[node.id]] -= b
    pinned = {v.id for v in graph.output_values()}
    release = [[] for _ in graph.nodes]
    values = {}
    for i, node in enumerate(graph.nodes):
        for v in node.outputs:
            values[v.id] = v
            if v.id not in pinned:
                release[last.get(v.id, i)].append(v.id)
    for v in graph.inputs:
        values[v.id] = v
        if v.id not in pinned and v.id in last:
            release[last[v.id]].append(v.id)

    # Bytes: a view (an output sharing an input's memory, as the probe saw) and
    # an in-place result own no memory: their root Value's buffer lives until
    # the last of them dies.
    root = {}
    for node in graph.nodes:
        slot = node.attrs.get("in_place")
        pairs = [(node.outputs[0].id, node.args[slot].id)] if slot is not None else []
        probed = kept.get(node.id)
        pairs += list(probed[2].items()) if probed is not None else []
        for out, inp in pairs:
            root[out] = root.get(inp, inp)
    dies = {}
    for vid, i in last.items():
        r = root.get(vid, vid)
        dies[r] = max(dies.get(r, i), i)
    free_at = [[] for _ in graph.nodes]
    for i, node in enumerate(graph.nodes):
        for v in node.outputs:
            if v.id not in root and v.id not in pinned and v.dtype is not None \
                    and v.device is not None:
                free_at[dies.get(v.id, i)].append(v.id)

    live, peak, total = 0, 0, 0
    free, buffers, sizes = [], {}, []
    for i, node in enumerate(graph.nodes):
        for v in node.outputs:
            if v.dtype is None or v.device is None:
                continue                    # a seed, not a tensor
            if v.id in root:                # a view or an in-place result
                if root[v.id] in buffers:
                    buffers[v.id] = buffers[root[v.id]]
                continue
            nb = v.nbytes
            live += nb
            total += nb
            fit = [b for b in free if sizes[b] >= nb]
            if fit:
                b = min(fit, key=lambda k: sizes[k])
                free.remove(b)
            else:
                b = len(sizes)
                sizes.append(nb)
            buffers[v.id] = b
        if extra[i] > 0:
            live += extra[i]
        peak = max(peak, live)
        if extra[i] < 0:
            live += extra[i]
        for vid in free_at[i]:
            live -= values[vid].nbytes
            free.append(buffers[vid])
    g = graph.copy()
    g.memory = MemoryPlan(release, peak, total, sum(sizes), buffers)
    g.history.append(("plan_memory", g.memory.summary()))
    return g
