"""Memory planning: liveness of every Value, release points, peak bytes, and
which buffers could be shared.

Each Value is born when its node runs and dies after its last reader.  The
executors drop their reference right there (``release``), so the allocator
(glibc malloc with pyflow's thresholds on the CPU, CuPy's pool on a GPU) hands
the same memory to the next op: that is where buffer reuse happens, because
pyflow's kernels allocate their own outputs.  The plan also assigns Values to
``buffers`` greedily (a Value may take a dead Value's buffer of at least its
size) to report what an arena would need.  Bytes held by autograd contexts
(saved activations) are counted through the Values a forward node reads, which
stay alive until its backward node runs.
"""
from dataclasses import dataclass


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


def plan_memory(graph):
    """IR -> IR: the same graph with ``graph.memory`` set."""
    index = {n.id: i for i, n in enumerate(graph.nodes)}
    last = {}
    for i, node in enumerate(graph.nodes):
        for v in node.inputs:
            last[v.id] = i
        if node.kind == "backward":        # the forward's inputs live in its ctx until here
            fwd = index[node.attrs["forward"]]
            for v in graph.nodes[fwd].inputs + graph.nodes[fwd].outputs:
                last[v.id] = max(last.get(v.id, i), i)
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

    live, peak, total = 0, 0, 0
    free, buffers, sizes = [], {}, []
    for i, node in enumerate(graph.nodes):
        for v in node.outputs:
            if v.dtype is None or v.device is None:
                continue                    # a seed, not a tensor
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
        peak = max(peak, live)
        for vid in release[i]:
            v = values[vid]
            if vid in buffers:
                live -= v.nbytes
                free.append(buffers[vid])
    g = graph.copy()
    g.memory = MemoryPlan(release, peak, total, sum(sizes), buffers)
    g.history.append(("plan_memory", g.memory.summary()))
    return g
