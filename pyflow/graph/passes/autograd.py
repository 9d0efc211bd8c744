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
"""
from ... import ops
from ..ir import Node, Value


def _grad_value(like, node, name):
    return Value(like.shape, like.dtype, like.device, "node", name=name, producer=node)


def _scaled_ones(shape, dtype, device, scale, placement=None):
    """The backward's seed.  For a global loss, the logical ``scale`` everywhere:
    replicated (broadcast) on ``placement``; the loss's backward boxes it to the
    layout it needs (a local seed would be read as each rank's piece of a
    partial sum, n times the gradient for a replicated loss)."""
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
                                         placement), {}, [], {"random": False},
                    name="grad_seed")
        node.outputs.append(_grad_value(loss, node, "grad_" + (loss.name or str(loss.id))))
        new_nodes.append(node)
        seed = node.outputs[0]
    pending = {loss.id: [seed]}            # value id -> gradient Values still to be summed

    def total(value):
        parts = pending.pop(value.id, None)
        if not parts:
            return None
        acc = parts[0]
        for k, part in enumerate(parts[1:]):
            node = Node("fn", ops.add, (acc, part), {}, [], {"random": False},
                        name=f"grad_sum_{value.name}_{k}")
            acc = _grad_value(value, node, f"grad_{value.name}_sum{k}")
            node.outputs.append(acc)
            new_nodes.append(node)
        return acc

    for fwd in reversed(g.nodes):
        if not differentiable(fwd) or not any(o.id in pending for o in fwd.outputs):
            continue
        if not any(v.id in needs for v in fwd.inputs):
            continue
        grads = [total(o) for o in fwd.outputs]
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
            out = _grad_value(positional[i], node, f"grad_{positional[i].name}@{fwd.name}")
            node.outputs.append(out)
            pending.setdefault(positional[i].id, []).append(out)
        new_nodes.append(node)

    for v in g.state:
        if v.tensor.requires_grad:
            grad = total(v)
            if grad is not None:
                node = Node("set_grad", v.tensor, (grad,), {}, [], {"state": v},
                            name=f"set_grad_{v.name}")
                new_nodes.append(node)
    for v in g.inputs:      # build()'s arguments that require grad, as eager's leaves
        if v.requires_grad:
            grad = total(v)
            if grad is not None:
                node = Node("set_grad", None, (v, grad), {}, [], {"input": v},
                            name=f"set_grad_{v.name}")
                new_nodes.append(node)
    g.nodes = g.nodes + new_nodes
    n_bwd = sum(n.kind == "backward" for n in new_nodes)
    n_sum = sum(n.kind == "fn" and n.target is ops.add for n in new_nodes)
    n_set = sum(n.kind == "set_grad" for n in new_nodes)
    g.history.append(("autograd", f"+{n_bwd} backward nodes, +{n_sum} gradient sums, "
                                  f"+{n_set} set_grad"))
    return g
