"""Residual fusions (``graph.config.allow_fuse_residual``): the two patterns a
transformer block writes around every residual connection become the fused
ops of ``pyflow/ops``, as OneFlow's graph passes rewrite them into its fused
kernels:

* ``dropout(x) + r`` (either order of the add), where nothing else reads the
  dropout's output, becomes ``FusedBiasDropoutAdd(x, None, r, p, seed)``: one
  pass that draws the same mask from the same seed Value, so the values are
  those of the two ops, bit for bit;
* ``s = a + b`` followed by ``layer_norm(s, ...)`` becomes
  ``FusedAddLayerNorm(a, b, ...)`` with two outputs, the norm's and ``s``
  (which a pre-LN block carries on as its residual stream): one pass writes
  both, and the backward adds ``s``'s gradient inside the norm's kernel.

Both need ``a``, ``b`` (or ``x``, ``r``) of the result's own shape (no
broadcasting) and float32/float64 data; the norm's weight and bias must exist
where the add was (parameters, inputs or earlier values), since the fused
node takes the add's place.  The pass runs on the forward graph before
elementwise fusion (which would otherwise swallow the adds) and before the
autograd pass, which then builds the fused ops' own backward nodes.
"""
from ... import dtypes as _dt
from ...ops.dropout import Dropout
from ...ops.elementwise import Add
from ...ops.fused import FusedBiasDropoutAdd
from ...ops.normalization import FusedAddLayerNorm, LayerNorm
from ..ir import Node, Value

__all__ = ["fuse_residual"]

_FLOATS = (_dt.float32, _dt.float64)


def _plain_add(node):
    """(a, b) of an Add node whose operands and result share shape and dtype."""
    if node.kind != "call" or node.target is not Add or node.kwargs or len(node.args) != 2:
        return None
    a, b = node.args
    (out,) = node.outputs
    if not (isinstance(a, Value) and isinstance(b, Value)) or out.dtype not in _FLOATS:
        return None
    if any(v.shape != out.shape or v.dtype is not out.dtype for v in (a, b)):
        return None
    return a, b


def fuse_residual(graph):
    users = graph.consumers()
    kept_values = {v.id for v in graph.output_values()}
    if graph.backward is not None:
        kept_values.add(graph.backward[0].id)
    position = {v.id: k for k, n in enumerate(graph.nodes) for v in n.outputs}
    replaced, dropped, lines = {}, set(), []
    for k, node in enumerate(graph.nodes):
        pair = _plain_add(node)
        if pair is None:
            continue
        fused = _dropout_add(node, pair, users, kept_values) or \
            _add_layer_norm(node, k, pair, users, position)
        if fused is not None:
            new, gone = fused
            replaced[node.id] = new
            dropped.add(gone.id)
            lines.append(f"{gone.name}+{node.name}")
    nodes = []
    for node in graph.nodes:
        if node.id in dropped:
            continue
        new = replaced.get(node.id, node)
        if new is not node:
            for v in new.outputs:
                v.producer = new
        nodes.append(new)
    g = graph.copy()
    g.nodes = nodes
    g.history.append(("fuse_residual", f"{len(lines)} fused" + (
        f": {', '.join(lines[:6])}" + (" ..." if len(lines) > 6 else "") if lines else "")))
    return g


def _dropout_add(node, pair, users, kept_values):
    for d_out, r in (pair, pair[::-1]):
        drop = d_out.producer
        if drop is None or drop.kind != "call" or drop.target is not Dropout:
            continue
        if len(users.get(d_out.id, ())) != 1 or d_out.id in kept_values:
            continue
        x, p, seed = drop.args
        new = Node("call", FusedBiasDropoutAdd, (x, None, r, p, seed), {}, node.outputs,
                   dict(node.attrs), name=node.name, id=node.id)
        return new, drop
    return None


def _add_layer_norm(node, k, pair, users, position):
    (s,) = node.outputs
    norm = next((n for n in users.get(s.id, ()) if n.kind == "call" and n.target is LayerNorm
                 and n.args[0] is s), None)
    if norm is None:
        return None
    _, weight, bias, normalized_shape, eps = norm.args
    for v in (weight, bias):
        if isinstance(v, Value) and position.get(v.id, -1) >= k:
            return None                 # made after the add: the fused node cannot wait
    attrs = dict(node.attrs, tuple_output=True)
    new = Node("call", FusedAddLayerNorm, (*pair, weight, bias, normalized_shape, eps), {},
               [norm.outputs[0], s], attrs, name=f"{norm.name}_{node.name}", id=node.id)
    return new, norm
