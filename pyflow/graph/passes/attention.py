"""Attention written out by hand becomes one fused attention node.

nanoGPT, minGPT and many PyTorch models spell causal self-attention as

    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
    att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    y = att @ v

Eager mode runs that as four kernels forward and more backward, each writing
a (B, H, T, S) tensor.  The trace shows the same chain of nodes:
``Matmul(q, Permute(k)) -> Mul(scale) -> Where(mask, -inf) -> Softmax(-1) ->
Matmul(., v)``.  ``fuse_attention`` finds it and puts one ``FusedAttention``
node (``pyflow/ops/attention.py``: one numba kernel forward, one backward,
scores never stored) in its place, as PyTorch's Inductor does with its
scaled-dot-product patterns and OneFlow with ``fused_scale_tril_softmax``.

What is matched, and why each condition:

- the scores are ``Matmul(q, kt)`` with ``kt`` a ``Permute`` swapping the
  last two axes of ``k`` (so the kernel reads ``k`` itself, no copy);
- then, optionally, a ``Mul`` by a Python number (either side) or a ``Div``
  by one: the scale (1 without);
- then, optionally, ``Where(mask, -inf, scores)`` (``masked_fill``) with a
  bool mask broadcastable to the scores: the kernel takes that same mask
  Value, not a guess that it is causal, so any mask works;
- then ``Softmax`` over the last axis with no scale or causal flag of its
  own, whose output only the final ``Matmul(probabilities, v)`` reads;
- every value in between has no other reader and is not an output of the
  graph or of its backward; all of them are local float32/float64 CPU
  tensors (the fused kernel is the CPU's; other devices keep the chain).

The result differs from the chain only by rounding: the kernel multiplies
each dot product by the scale and keeps the softmax in one pass (a row
masked everywhere is NaN in both).

Off by default (``graph.config.allow_fuse_attention(True)`` turns it on).
What it saves is memory: no (B, H, T, S) scores or probabilities are kept
for the backward.  It does not save time on this project's CPUs yet: the
chain's products are batched BLAS GEMMs, and the fused kernel's loops over
(query, key) pairs of 16-64 wide heads are slower than them.  Measured on 2
AMD EPYC cores (2026-12-03, eager forward + backward, kernels only, one
thread): a small GPT's attention (8 x 4 heads, T=32, E=16) 0.99-1.2x the
chain's time; 8 x 12 heads at T=128, E=64 1.6-2.7x.  A register-tiled kernel
(as ``kernels/cpu/conv_direct.py`` tiles convolutions) is the way to make it
faster; until then the pass is there for memory, and for the graph's shape.
"""
import math

from ... import dtypes as _dt
from ..ir import Node, Value, iter_values

_FLOATS = (_dt.float32, _dt.float64)


def _op(node, name):
    return node is not None and node.kind == "call" and getattr(node.target, "__name__", "") == name


def _number(a):
    return type(a) in (int, float) and math.isfinite(a)


def _sole_reader(value, users, escaping, reader):
    """Whether ``reader`` is the only node reading ``value``, once (``users`` lists
    a node once per read), and ``value`` escapes nowhere."""
    readers = users.get(value.id, [])
    return value.id not in escaping and len(readers) == 1 and readers[0] is reader


def _local_cpu_float(*values):
    return all(v.placement is None and v.dtype in _FLOATS and v.dtype is values[0].dtype
               and getattr(v.device, "type", None) == "cpu" for v in values)


def match(out_matmul, producer, users, escaping):
    """The attention chain ending at ``out_matmul`` as (q, k, v, mask or None,
    scale, chain nodes), or None when it is not one (see the module docstring)."""
    if not _op(out_matmul, "Matmul") or out_matmul.kwargs or len(out_matmul.args) != 2:
        return None
    probs, v = out_matmul.args
    if not isinstance(probs, Value) or not isinstance(v, Value):
        return None
    softmax = producer.get(probs.id)
    if not _op(softmax, "Softmax") or softmax.kwargs or not _sole_reader(probs, users, escaping,
                                                                          out_matmul):
        return None
    # Softmax.apply(x, dim, scale=1.0, causal=False): fill in the defaults not passed
    x, dim, scale_arg, causal = softmax.args + (1.0, False)[len(softmax.args) - 2:]
    if not isinstance(x, Value) or dim not in (-1, len(x.shape) - 1) or scale_arg != 1.0 \
            or causal or len(x.shape) < 3:
        return None
    chain, mask, scale = [softmax, out_matmul], None, 1.0
    node = producer.get(x.id)
    if _op(node, "Where") and len(node.args) == 3 and not node.kwargs:
        cond, fill, scores = node.args
        if not (isinstance(cond, Value) and cond.dtype is _dt.bool and isinstance(scores, Value)
                and type(fill) is float and fill == -math.inf
                and _sole_reader(x, users, escaping, softmax)):
            return None
        mask, x = cond, scores
        chain.insert(0, node)
        node = producer.get(x.id)
    if (_op(node, "Mul") or _op(node, "Div")) and len(node.args) == 2 and not node.kwargs:
        a, b = node.args
        nxt = chain[0]
        if _op(node, "Mul") and _number(a) and isinstance(b, Value):
            a, b = b, a
        if not (isinstance(a, Value) and _number(b) and b != 0
                and _sole_reader(x, users, escaping, nxt)):
            return None
        scale = float(b) if _op(node, "Mul") else 1.0 / float(b)
        chain.insert(0, node)
        x = a
        node = producer.get(x.id)
    if not _op(node, "Matmul") or node.kwargs or len(node.args) != 2 \
            or not _sole_reader(x, users, escaping, chain[0]):
        return None
    q, kt = node.args
    permute = producer.get(kt.id) if isinstance(kt, Value) else None
    if not isinstance(q, Value) or not _op(permute, "Permute") or len(permute.args) != 2:
        return None
    k, dims = permute.args
    n = len(kt.shape)
    if not isinstance(k, Value) or tuple(dims) != tuple(range(n - 2)) + (n - 1, n - 2):
        return None
    chain.insert(0, node)
    if len(q.shape) != n or len(v.shape) != n or n < 3 \
            or q.shape[:-2] != k.shape[:-2] or v.shape[:-2] != k.shape[:-2] \
            or v.shape[-2] != k.shape[-2] or q.shape[-1] != k.shape[-1] \
            or not _local_cpu_float(q, k, v, out_matmul.outputs[0]):
        return None          # broadcast batch dims, other devices, half types: the chain stays
    if mask is not None and (mask.placement is not None or len(mask.shape) > n):
        return None
    if len({n.attrs.get("grad_enabled") for n in chain}) != 1:
        return None
    return q, k, v, mask, scale, chain


def fuse_attention(graph):
    """IR -> IR: every attention chain (``match``) replaced by one node."""
    from ...ops.attention import FusedAttention
    producer = {o.id: n for n in graph.nodes for o in n.outputs}
    users = graph.consumers()
    escaping = {v.id for v in graph.output_values()}
    if graph.backward is not None:
        escaping.update(v.id for v in iter_values(graph.backward))
    replace, drop, lines = {}, set(), []
    for node in graph.nodes:
        found = match(node, producer, users, escaping)
        if found is None:
            continue
        q, k, v, mask, scale, chain = found
        last = chain[-1]
        fused = Node("call", FusedAttention, (q, k, v, mask, scale, False), {},
                     [last.outputs[0]],
                     dict(grad_enabled=last.attrs.get("grad_enabled"), non_differentiable=(),
                          tuple_output=False, fused=tuple(n.name for n in chain)),
                     name=f"attention_{last.name}")
        replace[last.id] = fused
        drop.update(n.id for n in chain[:-1])
        lines.append(f"{fused.name} <- {' '.join(n.op_name for n in chain)}")
    g = graph.copy()
    g.nodes = [replace.get(n.id, n) for n in graph.nodes if n.id not in drop]
    g.history.append(("fuse_attention", f"fused {len(lines)} attention chains"
                      + (": " + "; ".join(lines[:2]) + (" ..." if len(lines) > 2 else "")
                         if lines else "")))
    return g
