"""Slice-gradient accumulation: ``q, k, v = qkv.split(d, -1)`` without three
tensors of zeros in the backward.

The backward of a slice (``SliceViewBackward``) makes a tensor of zeros of the
sliced tensor's whole shape and writes the slice's gradient into it; the
autograd pass then sums those tensors (``grad_sum``).  For a split into three
that is three full-size zero fills, three scatters and two full-size adds,
where one tensor and three slice writes would do.  This pass rewrites every
``grad_sum = add(acc, part)`` whose ``part`` comes from a slice's backward
that nothing else reads into ``slice_add(acc, grad, key)``: ``acc`` with
``grad`` added into its ``key`` slice.  The slice's backward node goes away.
``passes.in_place`` then lets ``slice_add`` write into ``acc`` itself, so the
split's backward allocates one tensor instead of five.  Same numbers: every
element of the sum is ``acc + grad`` or ``acc + 0``, as before.
"""
from ... import ops
from ...ops._util import array_module
from ...ops.shape import SliceView, basic_view
from ...tensor import Tensor
from ..ir import Node, Value

__all__ = ["accumulate_slice_grads", "slice_add"]


def slice_add(acc, grad, key):
    """A copy of ``acc`` with ``grad`` added into ``acc[key]`` (basic key)."""
    out = array_module(acc._data).array(acc._data, copy=True)
    view = basic_view(out, key)
    view += grad._data
    return Tensor._make(out, acc.dtype, acc.device)


def accumulate_slice_grads(graph):
    """IR -> IR: gradient sums of slice backwards become ``slice_add`` nodes."""
    users = graph.consumers()
    by_id = {n.id: n for n in graph.nodes}
    replace, drop = {}, set()
    for node in graph.nodes:
        if node.kind != "fn" or node.target is not ops.add or len(node.args) != 2:
            continue
        acc, part = node.args
        b = part.producer if isinstance(part, Value) else None
        if (b is None or b.kind != "backward" or b.target is not SliceView
                or b.attrs.get("eager") or len(b.outputs) != 1 or b.id in drop
                or len(users.get(part.id, ())) != 1 or not isinstance(acc, Value)
                or acc.shape != part.shape or acc.dtype is not part.dtype):
            continue
        fwd = by_id.get(b.attrs["forward"])
        if fwd is None or len(fwd.args) != 2 or not isinstance(b.args[0], Value):
            continue
        grad, key = b.args[0], fwd.args[1]
        if grad.dtype is not acc.dtype or grad.device != acc.device:
            continue
        new = Node("fn", slice_add, (acc, grad, key), {}, node.outputs,
                   {"random": False, "slice_add": True}, name=node.name, id=node.id)
        for v in new.outputs:
            v.producer = new
        replace[node.id] = new
        drop.add(b.id)
    g = graph.copy()
    g.nodes = [replace.get(n.id, n) for n in graph.nodes if n.id not in drop]
    g.history.append(("accumulate_slice_grads",
                      f"{len(replace)} gradient sums add slices in place of "
                      f"{len(drop)} slice backwards"))
    return g
