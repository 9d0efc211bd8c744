"""Dead-code elimination and constant folding: two small IR -> IR passes."""
import copy

from ... import autograd
from ..ir import Value, iter_values, substitute


def dead_code_elimination(graph):
    """Drop nodes none of whose outputs reach the graph's outputs or a side
    effect (assign, set_grad, update, seed and random ops are kept: removing a
    random op would shift the generator stream that eager mode sees)."""
    with_backward = _forwards_with_backward(graph)
    live = {v.id for v in graph.output_values()}
    if graph.backward is not None:
        live.update(v.id for v in iter_values(graph.backward))
    keep = []
    for node in reversed(graph.nodes):
        if node.has_side_effect or node.id in with_backward or any(o.id in live for o in node.outputs):
            keep.append(node)
            live.update(v.id for v in node.inputs)
    keep.reverse()
    g = graph.copy()
    g.nodes = keep
    removed = [n.name for n in graph.nodes if n not in keep]
    g.history.append(("dead_code_elimination",
                      f"removed {len(removed)} nodes" + (f": {', '.join(removed[:8])}"
                                                         + (" ..." if len(removed) > 8 else "")
                                                         if removed else "")))
    return g


def constant_folding(graph):
    """Evaluate, at compile time, deterministic ``fn`` nodes whose inputs are all
    constants (creation ops like ``zeros``, ``arange``, the gradient seed, and
    ops on their results).  Their outputs become ``const`` Values holding the
    computed tensors; the nodes disappear.  ``call`` nodes are folded too when
    they need no gradient.  Nodes marked ``volatile`` (a value read when the
    step runs, as a loss scaler's seed) are kept."""
    with_backward = _forwards_with_backward(graph)
    consts = {}
    kept = []
    replaced = {}

    def lookup(v):
        return replaced.get(v.id, v)

    folded = []
    for node in graph.nodes:
        args = substitute(node.args, lookup)
        kwargs = substitute(node.kwargs, lookup)
        values = list(iter_values((args, kwargs)))
        foldable = (node.kind in ("fn", "call") and not node.attrs.get("random")
                    and not node.attrs.get("volatile")
                    and all(v.kind == "const" for v in values)
                    and node.id not in with_backward)
        if foldable:
            real = substitute((args, kwargs), lambda v: consts[v.id])
            with autograd.no_grad():
                if node.kind == "fn":
                    out = node.target(*real[0], **real[1])
                else:
                    out = node.target.forward(autograd.Context(), *real[0], **real[1])
            outs = out if isinstance(out, tuple) else (out,)
            for v, t in zip(node.outputs, outs):
                c = Value(v.shape, v.dtype, v.device, "const", name=v.name, tensor=t,
                          placement=t._placement, sbp=t._sbp)
                replaced[v.id] = c
                consts[c.id] = t
            folded.append(node.name)
            continue
        if any(v.id in replaced for v in node.inputs):
            node = _with_args(node, args, kwargs)
        kept.append(node)
    g = rebuilt(graph, kept, lookup)
    g.history.append(("constant_folding", f"folded {len(folded)} nodes into constants"
                      + (f": {', '.join(folded[:8])}" + (" ..." if len(folded) > 8 else "")
                         if folded else "")))
    return g


def rebuilt(graph, nodes, lookup):
    """A copy of ``graph`` with ``nodes``, whose outputs and backward read their
    Values through ``lookup`` (a pass that replaced some)."""
    g = graph.copy()
    g.nodes = nodes
    g.outputs = substitute(graph.outputs, lookup)
    if graph.backward is not None:
        g.backward = substitute(graph.backward, lookup)
    return g


def _forwards_with_backward(graph):
    return {n.attrs["forward"] for n in graph.nodes if n.kind == "backward"}


def _with_args(node, args, kwargs):
    """A copy of ``node`` reading other Values (same id: backward nodes refer
    to their forward node by id, and the Graph it came from stays unchanged)."""
    new = copy.copy(node)
    new.args, new.kwargs = args, kwargs
    return new
