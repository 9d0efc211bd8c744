"""The autograd pass: append the backward of ``loss.backward()`` to the graph.

Eager autograd records a tape while ops run and walks it at ``backward()``.
A graph knows the whole program in advance, so this pass does the walk once,
at compile time, and writes the result down as nodes:

1. which Values require grad: parameters and inputs that do, and every floating-point
   output of a ``call`` node that reads one (unless the op marked it
   non-differentiable or ran under ``no_grad``); ``fn`` nodes (comparisons,
   creation ops, ``detach``) stop gradients, as in eager mode;
2. walking the nodes backwards from the loss, one ``backward`` node per
   ``call`` node that receives a gradient.  It runs that op's own backward
   rule, ``Function.backward(ctx, *grads)``, with the ctx its forward node
   saved at run time, and yields a gradient per input that needs one.  Ops
   recorded whole (``recordable(differentiable=True)``, e.g. embedding
   with its data-dependent index checks) are differentiated by eager
   autograd over the tape their forward step kept;
3. a Value read by several ops gets the sum of their gradients (an ``fn`` node
   calling ``add``), exactly as the eager engine sums pending gradients;
4. a ``set_grad`` node per parameter stores the total in ``.grad``; one per
   input that requires grad adds it to the ``.grad`` of the tensor passed
   (eager mode accumulates into a leaf's ``.grad`` the same way).

The gradient of the loss is ``ones`` (scaled by ``1/accumulation`` when a
step is split into micro-batches) unless ``backward(gradient)`` gave one.

Over global tensors the gradients' layouts are fixed here too, by the dual
rule of ``pyflow/distributed/dispatch.py`` (S -> S, B -> P, P -> B), with
``box`` nodes where a layout must change (``passes.sbp.to_layout``): the
gradient reaching a global node's backward is boxed to the dual of that
output's SBP, and its input gradients are the dual of the inputs' SBPs;
gradient sums are ``Add`` calls with a signature fixed like any other; a
global parameter's gradient is boxed to the parameter's SBP (a replicated one
on a 1-D placement to partial_sum: data parallel's buckets all-reduce it);
a ``box`` node's backward is the identity on the logical gradient, which
keeps its layout (the consumer boxes as it needs).
"""
from ... import ops
from ...distributed.dispatch import dual
from ...distributed.global_tensor import Boxing, PlacementChange, ToLocal
from ...distributed.sbp import broadcast, partial_sum
from ...ops.elementwise import Add
from ..ir import Node, Value
from .sbp import layout_of, static_choice, to_layout


def _grad_value(like, node, name, placement=None, sbp=None):
    return Value(like.shape, like.dtype, like.device, "node", name=name, producer=node,
                 placement=placement, sbp=None if sbp is None else tuple(sbp))


def _duals(sbp):
    return tuple(dual(s) for s in sbp)


def _grad_target(p):
    """The SBP a global parameter's gradient is stored in: its own, except a
    replicated parameter on a 1-D placement, whose partial sums data parallel's
    buckets all-reduce (``executor.GradSync``)."""
    if p._sbp == (broadcast,) and p._placement.comm is not None:
        return (partial_sum,)
    return p._sbp


class LossScale:
    """The backward seed's value when a graph has a loss scaler
    (``Graph.set_grad_scaler``): the scaler's current scale divided by the
    accumulation steps, read when the step runs (the scale changes between
    steps), so the seed node is marked ``volatile`` and never folded."""

    def __init__(self, scaler, accumulation=1):
        self.scaler, self.accumulation = scaler, accumulation

    def __call__(self):
        return self.scaler._scale_value() / self.accumulation

    def __repr__(self):
        return f"LossScale(accumulation={self.accumulation})"


def _scaled_ones(shape, dtype, device, scale, placement=None):
    """The backward's seed.  For a global loss, the logical ``scale`` everywhere:
    replicated (broadcast) on ``placement``; the loss's backward boxes it to the
    layout it needs (a local seed would be read as each rank's piece of a
    partial sum, n times the gradient for a replicated loss).  ``scale`` is a
    number, or a ``LossScale`` read on every run."""
    if isinstance(scale, LossScale):
        scale = scale()
    seed = ops.full(shape, scale, dtype=dtype, device=device)
    if placement is not None:
        from ...distributed.dispatch import label
        from ...distributed.sbp import broadcast
        seed = label(seed, placement, (broadcast,) * placement.ndim, shape)
    return seed


def differentiable(node):
    """Autograd Function calls, and ops recorded whole with
    ``recordable(differentiable=True)`` (differentiated by eager autograd)."""
    return node.kind == "call" or node.kind == "fn" and node.attrs.get("differentiable")


def requires_grad(graph):
    """The set of Value ids that require grad."""
    needs = {v.id for v in graph.state if v.tensor.requires_grad}
    needs.update(v.id for v in graph.inputs if v.requires_grad)
    for node in graph.nodes:
        if node.kind == "box":          # the same logical value
            if node.inputs[0].id in needs:
                needs.add(node.outputs[0].id)
            continue
        if not differentiable(node) or not node.attrs.get("grad_enabled"):
            continue
        if any(v.id in needs for v in node.inputs):
            for i, out in enumerate(node.outputs):
                if out.dtype.is_floating_point and i not in node.attrs.get("non_differentiable", ()):
                    needs.add(out.id)
    return needs


def autograd(graph, loss_scale=1.0):
    """IR -> IR: the graph with its backward nodes (unchanged if build()
    called no backward)."""
    if graph.backward is None:
        return graph
    g = graph.copy()
    needs = requires_grad(g)
    loss, seed = g.backward
    if loss.id not in needs:
        raise RuntimeError("loss.backward() in build(): the loss does not depend on any "
                           "parameter or input that requires grad")
    new_nodes = []
    if seed is None:
        placement = getattr(graph, "loss_placement", None)
        node = Node("fn", _scaled_ones, (loss.shape, loss.dtype, loss.device, loss_scale,
                                         placement), {}, [],
                    {"random": False, "volatile": isinstance(loss_scale, LossScale)},
                    name="grad_seed")
        node.outputs.append(_grad_value(
            loss, node, "grad_" + (loss.name or str(loss.id)), placement,
            None if placement is None else (broadcast,) * placement.ndim))
        new_nodes.append(node)
        seed = node.outputs[0]
    pending = {loss.id: [seed]}            # value id -> gradient Values still to be summed

    def total(value):
        parts = pending.pop(value.id, None)
        if not parts:
            return None
        acc = parts[0]
        for k, part in enumerate(parts[1:]):
            name = f"grad_sum_{value.name}_{k}"
            if acc.placement is not None and part.placement is not None:
                acc = _global_sum(acc, part, value, name, k)
                continue
            node = Node("fn", ops.add, (acc, part), {}, [], {"random": False}, name=name)
            acc = _grad_value(value, node, f"grad_{value.name}_sum{k}")
            node.outputs.append(acc)
            new_nodes.append(node)
        return acc

    def _global_sum(acc, part, value, name, k):
        """``acc + part`` of two global gradients: an ``Add`` call whose signature
        is fixed now (the Add rule over the Values), its inputs boxed to it."""
        placement = acc.placement
        chosen = static_choice(Add, (acc, part), placement)
        args = [to_layout(v, placement, tuple(c.ins[j] for c in chosen), f"{name}.arg{j}",
                          new_nodes) for j, v in enumerate((acc, part))]
        node = Node("call", Add, tuple(args), {}, [],
                    {"grad_enabled": False, "non_differentiable": (), "tuple_output": False,
                     "signature": (Add, placement, chosen), "grad_sum": True}, name=name)
        out = _grad_value(value, node, f"grad_{value.name}_sum{k}", placement,
                          tuple(c.outs[0] for c in chosen))
        node.outputs.append(out)
        new_nodes.append(node)
        return out

    for fwd in reversed(g.nodes):
        if fwd.kind == "box":       # identity on the logical gradient
            (src,) = fwd.inputs
            if src.id in needs and fwd.outputs[0].id in pending:
                grad = total(fwd.outputs[0])
                if grad is not None:
                    pending.setdefault(src.id, []).append(grad)
            continue
        if not differentiable(fwd) or not any(o.id in pending for o in fwd.outputs):
            continue
        if not any(v.id in needs for v in fwd.inputs):
            continue
        grads = [total(o) for o in fwd.outputs]
        placement = _global_placement(fwd)
        if placement is not None:   # each gradient to the dual of its output's SBP
            grads = [None if gv is None else gv if gv.placement is None or o.sbp is None else
                     to_layout(gv, placement, _duals(o.sbp), f"{gv.name}", new_nodes)
                     for gv, o in zip(grads, fwd.outputs)]
        # slots: positions of the inputs that get a gradient; for a Function,
        # among its positional arguments (what backward returns); for an eager
        # node, among all its input Values in order
        positional = list(fwd.args) if fwd.kind == "call" else fwd.inputs
        slots = [i for i, a in enumerate(positional) if isinstance(a, Value) and a.id in needs]
        node = Node("backward", fwd.target, tuple(grads), {}, [],
                    {"forward": fwd.id, "slots": tuple(slots), "eager": fwd.kind == "fn",
                     "needs_input_grad": tuple(i in slots for i in range(len(positional)))},
                    name=f"{fwd.name}_backward")
        for i in slots:
            layout = _conversion_grad_layout(fwd, grads) if placement is None else dict(
                placement=placement, sbp=_duals(layout_of(positional[i], placement)))
            out = _grad_value(positional[i], node, f"grad_{positional[i].name}@{fwd.name}",
                              **layout)
            node.outputs.append(out)
            pending.setdefault(positional[i].id, []).append(out)
        new_nodes.append(node)

    for v in g.state:
        if v.tensor.requires_grad:
            grad = total(v)
            if grad is not None and v.tensor._placement is not None:
                p = v.tensor
                grad = to_layout(grad, p._placement, _grad_target(p), f"grad_{v.name}",
                                 new_nodes, src=_leaf_grad_layout(grad, p))
            if grad is not None:
                node = Node("set_grad", v.tensor, (grad,), {}, [], {"state": v},
                            name=f"set_grad_{v.name}")
                new_nodes.append(node)
    for v in g.inputs:      # build()'s arguments that require grad, as eager's leaves
        if v.requires_grad:
            grad = total(v)
            if grad is not None and v.placement is not None:
                grad = to_layout(grad, v.placement, v.sbp, f"grad_{v.name}", new_nodes,
                                 src=grad.sbp if grad.placement is not None
                                 else _duals(v.sbp))
            if grad is not None:
                node = Node("set_grad", None, (v, grad), {}, [], {"input": v},
                            name=f"set_grad_{v.name}")
                new_nodes.append(node)
    g.nodes = g.nodes + new_nodes
    n_bwd = sum(n.kind == "backward" for n in new_nodes)
    n_sum = sum(n.kind == "fn" and n.target is ops.add or n.attrs.get("grad_sum", False)
                for n in new_nodes)
    n_set = sum(n.kind == "set_grad" for n in new_nodes)
    n_box = 0
    for n in new_nodes:
        if n.kind == "box":
            n.attrs["backward"] = True      # explain totals the two directions apart
            n_box += 1
    g.history.append(("autograd", f"+{n_bwd} backward nodes, +{n_sum} gradient sums, "
                                  f"+{n_set} set_grad" + (f", +{n_box} box nodes"
                                                          if n_box else "")))
    return g


def _global_placement(fwd):
    """The placement of a node on global tensors whose signature is fixed (a call
    node of ``passes.sbp``, or a node recorded whole that replays its ops'
    signatures), else None."""
    sig = fwd.attrs.get("signature")
    if sig is not None:
        return sig[1]
    if fwd.attrs.get("replay"):
        return fwd.attrs["replay"][0][1]
    return None


def _leaf_grad_layout(grad, p):
    """The layout a global leaf's gradient Value has (a local one is the piece
    of the dual layout, as ``dispatch.box_gradient`` takes it)."""
    return grad.sbp if grad.placement is not None else _duals(p._sbp)


def _conversion_grad_layout(fwd, grads):
    """The layout of the input gradient of a layout conversion written in build()
    (``to_local``, ``to_global``), as its backward labels it; {} for a local one."""
    if fwd.kind != "call":
        return {}
    if fwd.target is ToLocal:
        x = fwd.args[0]
        return dict(placement=x.placement, sbp=_duals(x.sbp))
    if fwd.target is PlacementChange:
        src, src_sbp = fwd.args[1], fwd.args[2]
        return dict(placement=src, sbp=_duals(src_sbp))
    if fwd.target is Boxing and grads[0] is not None:   # the gradient as it came
        return dict(placement=grads[0].placement, sbp=grads[0].sbp)
    return {}
