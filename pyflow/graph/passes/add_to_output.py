"""Add-to-output fusion (``graph.config.allow_fuse_add_to_output``).

``y = linear(x, w, b) + r`` (a residual connection) allocates the linear
output and then a second tensor for the sum.  When the matrix product's output
is read by nothing but that add, the add can write into the product's own
buffer: ``out += r``.  That is OneFlow's add-to-output fusion, done here as a
rewrite of the add node into ``AddToOutput`` (an in-place add with the add's
backward).  It is safe because Linear, Matmul and Conv2d keep their inputs,
not their output, for backward, and nothing else reads the output.
"""
from ... import dtypes as _dt
from ...autograd import Function
from ...ops._util import unbroadcast
from ...ops.conv import Conv2d
from ...ops.elementwise import Add
from ...ops.linalg import Linear, Matmul
from ..ir import Node, Value
from ...distributed.signatures import elementwise_rule
from ...distributed.sbp import partial_sum as P

PRODUCERS = (Linear, Matmul, Conv2d)


class AddToOutput(Function):
    """``out += other`` into the producer's buffer; gradient as ``add``."""
    sbp_rule = elementwise_rule(partial=[(P, P)])

    @staticmethod
    def forward(ctx, out, other):
        ctx.other_shape = tuple(other.shape)
        out._data += other._data
        return out._view_of(out._data)

    @staticmethod
    def backward(ctx, g):
        return g, unbroadcast(g, ctx.other_shape)


def fuse_add_to_output(graph):
    """IR -> IR: every eligible ``Add(product, other)`` becomes ``AddToOutput``."""
    users = graph.consumers()
    outputs = {v.id for v in graph.output_values()}
    rewritten, nodes = [], []
    for node in graph.nodes:
        target = _eligible(node, users, outputs)
        if target is None:
            nodes.append(node)
            continue
        product, other = target
        new = Node("call", AddToOutput, (product, other), {}, node.outputs, dict(node.attrs),
                   name=node.name, id=node.id)
        for v in new.outputs:
            v.producer = new
        nodes.append(new)
        rewritten.append(node.name)
    g = graph.copy()
    g.nodes = nodes
    g.history.append(("fuse_add_to_output", f"{len(rewritten)} adds write into their matrix "
                      f"product's output" + (f": {', '.join(rewritten[:8])}" if rewritten else "")))
    return g


def _eligible(node, users, outputs):
    if node.kind != "call" or node.target is not Add or node.kwargs or len(node.args) != 2:
        return None
    a, b = node.args
    if not (isinstance(a, Value) and isinstance(b, Value)):
        return None
    out = node.outputs[0]
    for product, other in ((a, b), (b, a)):
        p = product.producer
        if (product.kind == "node" and p is not None and p.kind == "call"
                and p.target in PRODUCERS and product.id not in outputs
                and len(users.get(product.id, ())) == 1 and product.id != other.id
                and product.shape == out.shape and product.dtype is out.dtype
                and other.dtype is out.dtype and other.device == out.device
                and out.dtype in (_dt.float32, _dt.float64)):
            return product, other
    return None
