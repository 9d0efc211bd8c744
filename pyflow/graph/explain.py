"""Watching a compiled graph: ``pyflow.explain(graph)`` and ``graph.to_dot``.

``explain`` prints, for each compiled plan: the passes in order with what each
changed, the final logical graph (one line per node; a ``box`` node shows
its conversion, collective and bytes), for global tensors the SBP
signatures and the box nodes with their totals, the memory plan, which
nodes run as kernels on arrays (the kernel-level plan) and which through
their Tensor-level step, and the actor task graph (actors, streams, register edges).  ``to_dot`` draws box
nodes in pink, labelled like their line in the logical graph.
"""
from ..distributed.boxing import describe_nd, kind_of
from .ir import iter_values
from .cuda_graph import summary as cuda_graph_summary
from .kernel_plan import summary as kernel_summary


def explain_plan(plan):
    lines = ["passes:"]
    for name, graph in plan.stages:
        last = graph.history[-1]
        lines.append(f"  {name:<22} {last[1]}  ({len(graph.nodes)} nodes)")
    lines.append("")
    lines.append("logical graph:")
    lines.append(str(plan.graph))
    if getattr(plan.graph, "is_global", False):
        lines.append("")
        lines.extend(_sbp_lines(plan))
    if plan.graph.memory is not None:
        lines.append("")
        lines.append("memory: " + plan.graph.memory.summary())
    if plan.kernel_plan:
        lines.append("")
        lines.append(kernel_summary(plan))
        lines.append(cuda_graph_summary(plan))
    lines.append("")
    lines.append(plan.task_graph[0].describe())
    return "\n".join(lines)


def _sbp_lines(plan):
    """Global tensors: each forward node's output SBP and the boxing its inputs
    need (bytes sent per rank), the box nodes that do the boxing (forward and
    backward, from ``passes.sbp`` and the autograd pass: the backward's by the
    dual rule of pyflow/distributed/dispatch.py), and data parallel's gradient
    all-reduce."""
    lines = ["SBP (forward signatures from the trace; boxing bytes sent per rank):"]
    total = 0
    for node in plan.graph.nodes:
        info = node.attrs.get("sbp")
        if info is None:
            continue
        placement, outs, boxings = info
        out = ", ".join("(" + ", ".join(_short(s) for s in sbp) + ")" for sbp in outs)
        lines.append(f"  {node.name:<28} -> {out}")
        for arg, src, dst, shape, dtype in boxings:
            text, nbytes = boxing_text(src, dst, shape, dtype, placement)
            total += nbytes
            lines.append(f"      boxing arg {arg} {text}")
    lines.append(f"  forward boxing total: {total:,} bytes per rank per step")
    lines.extend(_box_node_lines(plan.graph))
    sync = plan.grad_sync
    if sync is not None:
        for b in sync.bucketers:
            n = sum(len(bk.params) for bk in b.buckets)
            size = sum(bk.nbytes for bk in b.buckets)
            lines.append(f"  gradient all_reduce (data parallel): {n} parameters in "
                         f"{len(b.buckets)} bucket(s) of {size:,} bytes over {b.comm.size} "
                         f"ranks, before the update")
    return lines


def _box_node_lines(graph):
    """One line per ``box`` node: the tensor, the conversion on its placement
    axis, the collective and the bytes each rank sends; totals per direction."""
    boxes = [n for n in graph.nodes if n.kind == "box"]
    if not boxes:
        return ["box nodes: none (every op runs in its inputs' layout)"]
    lines = ["box nodes (compile time; collective, bytes sent per rank):"]
    totals = {False: 0, True: 0}
    for n in boxes:
        st, v = n.attrs["step"], n.outputs[0]
        totals[bool(n.attrs.get("backward"))] += st.bytes
        axis = f" axis {st.axis}" if len(n.attrs["src"]) > 1 else ""
        lines.append(f"  {n.name:<40} {'x'.join(map(str, v.shape)) or 'scalar'} "
                     f"({', '.join(map(_short, n.attrs['src']))}) -> "
                     f"({', '.join(map(_short, n.attrs['dst']))}){axis}: {st.op}, "
                     f"{st.bytes:,} bytes")
    lines.append(f"  box nodes total: forward {totals[False]:,} bytes, backward "
                 f"{totals[True]:,} bytes per rank per step")
    return lines


def boxing_text(src, dst, shape, dtype, placement):
    """One boxing of a logical tensor of ``shape``/``dtype`` from nd-sbp ``src`` to
    ``dst`` on ``placement`` (or its axis sizes) as ``(text, bytes)``: its
    collectives in order (the boxing table's, through ``describe_nd``) and the
    bytes each rank sends, e.g. ``("8x16 (S(0)) -> (B): all_gather, 256 bytes",
    256)`` for float32 on 2 ranks."""
    steps = describe_nd(src, dst, shape, dtype, placement)
    nbytes = sum(st.bytes for st in steps)
    ops = " + ".join(st.op for st in steps) or "identity"
    return (f"{'x'.join(map(str, shape))} ({', '.join(map(_short, src))}) -> "
            f"({', '.join(map(_short, dst))}): {ops}, {nbytes:,} bytes"), nbytes


def _short(sbp):
    """S(d), B or P: the boxing table's kind, with the split dim."""
    kind = kind_of(sbp)
    return f"S({sbp.dim})" if kind == "S" else kind


def explain(graph):
    """Text for an ``nn.Graph`` (all its plans) or a single Plan."""
    plans = getattr(graph, "plans", None)
    if plans is None:
        return explain_plan(graph)
    if not plans:
        return f"{type(graph).__name__}: not compiled yet (call it once, or graph.compile(*args))"
    parts = []
    for i, plan in enumerate(plans):
        sig = ", ".join(v.describe() for v in plan.graph.inputs)
        parts.append(f"=== plan {i}: inputs {sig or 'none'} ===")
        parts.append(explain_plan(plan))
    return "\n".join(parts)


def logical_dot(graph):
    """Graphviz text of a logical Graph: nodes as boxes, Values as edges."""
    q = lambda s: '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'  # noqa: E731
    lines = ["digraph logical {", "  rankdir=TB;", "  node [fontname=Helvetica, shape=box];"]
    producer = {}
    for v in graph.inputs:
        lines.append(f"  {q(v.name)} [shape=invhouse];")
        producer[v.id] = v.name
    for node in graph.nodes:
        color = {"backward": "lightblue", "update": "orange", "set_grad": "lightgrey",
                 "assign": "lightgrey", "seed": "yellow", "box": "pink"}.get(node.kind)
        style = f", style=filled, fillcolor={color}" if color else ""
        lines.append(f"  {q(node.name)} [label={q(node.op_name)}{style}];")
        for v in node.outputs:
            producer[v.id] = node.name
    for node in graph.nodes:
        for v in node.inputs:
            if v.id in producer:
                label = "x".join(map(str, v.shape))
                lines.append(f"  {q(producer[v.id])} -> {q(node.name)} [label={q(label)}];")
        if node.kind == "backward":
            fwd = next((n for n in graph.nodes if n.id == node.attrs["forward"]), None)
            if fwd is not None:
                lines.append(f"  {q(fwd.name)} -> {q(node.name)} [style=dashed, label=ctx];")
    lines.append('  "outputs" [shape=house];')
    for v in iter_values(graph.returned()):
        if v.id in producer:
            lines.append(f"  {q(producer[v.id])} -> \"outputs\";")
    if graph.input_writes:          # build() wrote these inputs in place
        for i, v in zip(graph.input_writes, graph.outputs[1]):
            if v.id in producer:
                lines.append(f"  {q(producer[v.id])} -> {q(graph.inputs[i].name)} "
                             f"[style=dashed, label=\"write back\"];")
    lines.append("}")
    return "\n".join(lines) + "\n"
