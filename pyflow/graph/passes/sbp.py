"""SBP at compile time: fix each global node's signature once and make its
boxing explicit ``box`` nodes.

In eager mode every op on global tensors deduces a signature and boxes its
inputs when it runs (``pyflow.distributed.dispatch.forward_global``).  A
graph knows every op, layout and shape before it runs, so this pass does
that work once:

* a ``call`` node on global Values keeps the signature the trace chose
  (``attrs["signature"]``); a node the trace did not run as it is (a fused
  elementwise chain, ``AddToOutput``) gets one deduced here from its Values'
  shapes and layouts, with the same rule and cost as eager (``static_choice``);
* each input whose SBP differs from the signature's gets one ``box`` node per
  step of its conversion (``boxing.describe_nd``: the boxing table's
  collective on one placement axis, with its bytes per rank), and the node
  reads the last one's output;
* a ``to_global(sbp=...)`` written in build() becomes box nodes too.

The step of such a node then runs only the op on the pieces
(``dispatch.forward_pieces``), and a box node only ``boxing.run_step``.
The autograd pass uses ``to_layout`` for the backward's boxing (each
gradient to the dual of its output's SBP, gradient sums under the Add rule,
each global parameter's gradient to its own SBP), so a compiled step never
enters the eager SBP dispatch.  ``explain`` and ``to_dot`` show the box nodes.
"""
import copy

from ...distributed.boxing import describe_nd
from ...distributed.dispatch import deduce, out_sbps
from ...distributed.global_tensor import Boxing
from ...distributed.sbp import broadcast
from ..ir import Node, Value

__all__ = ["insert_boxing", "to_layout", "static_choice", "layout_of", "tensor_positions"]


class _Meta:
    """What an SBP rule and the deduction's cost read of a tensor (shape, ndim,
    dtype, placement, SBP), for a Value: rules run on these at compile time."""

    def __init__(self, value, sbp):
        self.shape, self.dtype = tuple(value.shape), value.dtype
        self.ndim = len(self.shape)
        self._placement, self._sbp = value.placement, sbp


def layout_of(value, placement):
    """A Value's SBP on ``placement``: its own, or replicated for a local Value
    (a local tensor among a global op's arguments is taken as replicated)."""
    return value.sbp if value.placement is not None else (broadcast,) * placement.ndim


def tensor_positions(args):
    """Positions of the tensor arguments in an args template (a seed's Value is
    an int when the node runs, not a tensor)."""
    return [i for i, a in enumerate(args) if isinstance(a, Value)
            and not (a.producer is not None and a.producer.kind == "seed")]


def _placement_of(node, values):
    placements = {v.placement for v in values if v.placement is not None}
    if len(placements) > 1:
        raise RuntimeError(f"{node.name}: expected all global tensors on one placement, got "
                           f"{sorted(map(repr, placements))}")
    return placements.pop() if placements else None


def static_choice(fn_class, args, placement):
    """The signature (one candidate per placement axis) eager's dispatch would
    choose for ``fn_class`` called on the Values in ``args``."""
    metas, sbps, template = [], [], list(args)
    for p in tensor_positions(args):
        sbp = layout_of(args[p], placement)
        template[p] = _Meta(args[p], sbp)
        metas.append(template[p])
        sbps.append(sbp)
    return tuple(deduce(fn_class, template, metas, sbps, tuple(placement.hierarchy)))


def to_layout(value, placement, want, name, nodes, src=None, out=None):
    """``value`` in SBP ``want``: appends to ``nodes`` one ``box`` node per step of
    the conversion and returns the last Value (``value`` itself when nothing
    changes).  ``src``: the layout ``value`` has (default: its own; a local Value
    is taken as replicated).  ``out``: the Value the last box node should make
    (a traced ``to_global``'s output, which consumers already read)."""
    src = tuple(src if src is not None else layout_of(value, placement))
    want = tuple(want)
    if src == want:
        return value
    steps = describe_nd(src, want, value.shape, value.dtype, placement)
    cur, v = list(src), value
    for k, st in enumerate(steps):
        before = tuple(cur)
        cur[st.axis] = st.dst
        node = Node("box", placement, (v,), {}, [],
                    {"step": st, "placement": placement, "src": before, "dst": tuple(cur)},
                    name=f"box_{name}" + (f".{k}" if len(steps) > 1 else ""))
        if out is not None and k == len(steps) - 1:
            v = out
            v.producer = node
        else:
            v = Value(value.shape, value.dtype, value.device, "node", name=node.name,
                      producer=node, placement=placement, sbp=tuple(cur))
        node.outputs.append(v)
        nodes.append(node)
    return v


def insert_boxing(graph):
    """IR -> IR: fixed signatures and ``box`` nodes for the global nodes."""
    g = graph.copy()
    if not getattr(graph, "is_global", False):
        g.history.append(("insert_boxing", "no global tensors"))
        return g
    nodes, fixed, boxes = [], 0, 0
    for node in graph.nodes:
        if node.kind != "call":
            nodes.append(node)
            continue
        if node.target is Boxing:          # to_global(sbp=...) in build()
            x, placement, src, dst = node.args[:4]
            if tuple(src) != tuple(dst):
                before = len(nodes)
                to_layout(x, placement, dst, node.name, nodes, src=src, out=node.outputs[0])
                boxes += len(nodes) - before
                continue
            nodes.append(node)
            continue
        positions = tensor_positions(node.args)
        placement = _placement_of(node, [node.args[p] for p in positions])
        if placement is None or getattr(node.target, "handles_global", False):
            nodes.append(node)
            continue
        recorded = node.attrs.get("signature")
        if recorded is not None and recorded[0] is node.target and recorded[1] == placement:
            chosen = recorded[2]
        else:
            chosen = static_choice(node.target, node.args, placement)
        args = list(node.args)
        for j, p in enumerate(positions):
            want = tuple(c.ins[j] for c in chosen)
            before = len(nodes)
            args[p] = to_layout(args[p], placement, want, f"{node.name}.arg{p}", nodes)
            boxes += len(nodes) - before
        new = copy.copy(node)
        new.args = tuple(args)
        new.attrs = dict(node.attrs, signature=(node.target, placement, chosen))
        for v, sbp in zip(node.outputs, out_sbps(chosen, len(node.outputs))):
            v.placement, v.sbp = placement, sbp
        nodes.append(new)
        fixed += 1
    g.nodes = nodes
    g.history.append(("insert_boxing", f"{fixed} signatures fixed, +{boxes} box nodes"))
    return g
