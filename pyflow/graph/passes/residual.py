"""Residual fusions (``graph.config.allow_fuse_residual``): the patterns a
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

* (``fuse_batch_norm_relu``, a pass of its own, ``graph.config.
  allow_fuse_batch_norm_relu``, off by default) ``relu(batch_norm(x) + r)`` (a
  ResNet block's tail) and ``relu(batch_norm(x))`` become ``BatchNormAddRelu``
  (OneFlow's ``normalization_add_relu``): the normalization, the add and the
  relu in one pass, the backward in one kernel (the statistics and running
  averages stay the ops they were).  Off because on DLPerf's ResNet-50 CPU
  preset it was slower (graph steps 379-454 ms against 300-352 ms): at those
  shapes the fused kernel was no faster than the three (2.43 vs 2.45 ms at
  (8, 256, 16, 16), 2.76 vs 2.05 at (8, 64, 32, 32), 1.00 vs 0.57 at
  (8, 2048, 2, 2)).

All need ``a``, ``b`` (or ``x``, ``r``) of the result's own shape (no
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
from ...ops.elementwise import _Unary
from ...ops.normalization import BatchNorm, BatchNormAddRelu, FusedAddLayerNorm, LayerNorm
from ..ir import Node, Value

__all__ = ["fuse_residual", "fuse_batch_norm_relu"]

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
    """IR -> IR: dropout + add and add + layer_norm as fused ops."""
    def rewrite(node, k, users, kept_values, position):
        pair = _plain_add(node)
        if pair is None:
            return None
        return _dropout_add(node, pair, users, kept_values) or \
            _add_layer_norm(node, k, pair, users, position)
    return _rewritten(graph, rewrite, "fuse_residual")


def fuse_batch_norm_relu(graph):
    """IR -> IR: relu(batch_norm(x) [+ r]) as BatchNormAddRelu nodes."""
    def rewrite(node, k, users, kept_values, position):
        return _batch_norm_relu(node, users, kept_values)
    return _rewritten(graph, rewrite, "fuse_batch_norm_relu")


def _rewritten(graph, rewrite, name):
    """The graph with each node for which ``rewrite`` gives (fused node, nodes it
    replaces) replaced by the fused node, and those nodes dropped."""
    users = graph.consumers()
    kept_values = {v.id for v in graph.output_values()}
    if graph.backward is not None:
        kept_values.add(graph.backward[0].id)
    position = {v.id: k for k, n in enumerate(graph.nodes) for v in n.outputs}
    replaced, dropped, lines = {}, set(), []
    for k, node in enumerate(graph.nodes):
        fused = rewrite(node, k, users, kept_values, position)
        if fused is not None:
            new, gone = fused
            replaced[node.id] = new
            dropped.update(n.id for n in gone)
            lines.append("+".join(n.name for n in gone) + f"+{node.name}")
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
    g.history.append((name, f"{len(lines)} fused" + (
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
        return new, [drop]
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
    return new, [norm]


def _only_reader(value, users, kept_values):
    return len(users.get(value.id, ())) == 1 and value.id not in kept_values


def _batch_norm_relu(node, users, kept_values):
    """A Relu node reading batch_norm(x) + r or batch_norm(x), each value read by
    nothing else: (the BatchNormAddRelu node, [the nodes it replaces])."""
    if node.kind != "call" or not (isinstance(node.target, type)
                                   and issubclass(node.target, _Unary)
                                   and node.target.name == "relu") or node.kwargs:
        return None
    (v,) = node.args
    (out,) = node.outputs
    if not isinstance(v, Value) or v.dtype not in _FLOATS or v.producer is None:
        return None
    gone, addend, norm_out = [], None, v
    pair = _plain_add(v.producer)
    if pair is not None and _only_reader(v, users, kept_values):
        for bn_out, r in (pair, pair[::-1]):
            if bn_out.producer is not None and bn_out.producer.target is BatchNorm:
                gone.append(v.producer)
                addend, norm_out = r, bn_out
                break
    norm = norm_out.producer
    if norm is None or norm.kind != "call" or norm.target is not BatchNorm or norm.kwargs \
            or not _only_reader(norm_out, users, kept_values):
        return None
    x, weight, bias, mean, var, training, eps = norm.args
    new = Node("call", BatchNormAddRelu, (x, addend, weight, bias, mean, var, training, eps),
               {}, node.outputs, dict(node.attrs), name=node.name, id=node.id)
    return new, [norm] + gone
