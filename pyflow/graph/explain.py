"""Watching a compiled graph: ``pyflow.explain(graph)`` and ``graph.to_dot``.

``explain`` prints, for each compiled plan: the passes in order with what each
changed, the final logical graph (one line per node), the memory plan, and
the actor task graph (actors, streams, register edges).
"""
from .ir import iter_values


def explain_plan(plan):
    lines = ["passes:"]
    for name, graph in plan.stages:
        last = graph.history[-1]
        lines.append(f"  {name:<22} {last[1]}  ({len(graph.nodes)} nodes)")
    lines.append("")
    lines.append("logical graph:")
    lines.append(str(plan.graph))
    if plan.graph.memory is not None:
        lines.append("")
        lines.append("memory: " + plan.graph.memory.summary())
    lines.append("")
    lines.append(plan.task_graph[0].describe())
    return "\n".join(lines)


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
                 "assign": "lightgrey", "seed": "yellow"}.get(node.kind)
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
    for v in iter_values(graph.outputs):
        if v.id in producer:
            lines.append(f"  {q(producer[v.id])} -> \"outputs\";")
    lines.append("}")
    return "\n".join(lines) + "\n"
