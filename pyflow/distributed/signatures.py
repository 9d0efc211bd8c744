"""SBP signatures: which layouts of its inputs an op can compute on locally.

A *signature* of an op says: if every input has this SBP, running the op's
ordinary (single-device) forward on each rank's pieces gives the pieces of the
logical result with that output SBP.  ``matmul`` has, among others::

    (S(0), B)    -> S(0)     rows of x split, weight replicated: rows of y split
    (B,    S(1)) -> S(1)     columns of the weight split: columns of y split
    (S(1), S(0)) -> P        the reduced dim split: every rank holds a partial sum
    (B,    B)    -> B        everything replicated: compute everywhere

Each op declares its rule in its own class, beside its forward and backward
(``class Matmul(Function): sbp_rule = matmul_rule``), as OneFlow keeps an op's
SBP signature beside its shape inference.  This module holds the rule
builders the ops use; it imports nothing above ``sbp.py``, so the ops (one
layer below the rest of ``pyflow.distributed``) can import it.

``dispatch.py`` asks an op's rule for its candidates, picks the one whose
input boxing moves the fewest bytes (``boxing.describe``), boxes the inputs,
runs the op on the pieces and labels the outputs.  As in OneFlow, a rule
describes one placement axis; on an N-D placement each axis picks its own.

**Every op has a signature.**  An op without an ``sbp_rule`` gets
``(B, ..., B) -> B``: compute on the whole tensor on every rank.  That is
always correct for a deterministic op (random ops draw from each rank's
generator, equal when the ranks seed alike), only not the cheapest.  The
families below declare what they can do better:

* elementwise ops (unary, binary with broadcasting, where, clamp, casts,
  clone, dropout): a split on any dim the inputs share; linear ones keep P;
* matmul / linear: the three splits above, batch dims, bias handling;
* reductions (sum, mean, amax...): split on kept dims; sum and mean of a
  split dim give P (mean with a factor 1/n, the equal-split share);
* softmax / log_softmax / layer_norm / cross_entropy / nll_loss: split on
  the dims they do not normalize over;
* embedding: split indices (data parallel) or split embedding columns;
* views (view/reshape, permute, expand, slices, split): splits follow the dim
  mapping; their shape arguments are translated to the piece (``localize``).

A rule is ``rule(args) -> [Candidate]`` over the op's positional arguments
(the ``Function.apply`` arguments, tensors and others); ``Candidate.ins`` has
one SBP per *tensor* argument in order, ``outs`` one per output.  Rules see
logical shapes (``t.shape``).
"""
from collections import namedtuple

from .sbp import broadcast as B
from .sbp import partial_sum as P
from .sbp import split as S

__all__ = ["Candidate", "rule_for", "register_rule", "broadcast_only", "elementwise_rule",
           "unary_linear_rule", "add_sub_rule", "mul_rule", "div_rule", "matmul_rule",
           "linear_rule", "reduce_rule", "rows_rule", "softmax_rule", "layer_norm_rule",
           "loss_rule", "embedding_rule", "view_rule", "permute_rule", "expand_rule",
           "slice_rule", "split_rule", "cat_rule"]

Candidate = namedtuple("Candidate", "ins outs scale localize", defaults=(None, None))
Candidate.__doc__ = """One signature: input SBPs (tensor args in order), output SBPs, an
optional factor applied to the outputs (``mean`` of a split dim: 1/n) and an optional
``localize(args, n_of_dim) -> args`` translating shape arguments to the piece."""

def rule_for(fn_class):
    """The rule ``fn_class`` declares (``sbp_rule``, inherited from the nearest
    base class that sets one), or ``broadcast_only``."""
    return getattr(fn_class, "sbp_rule", None) or broadcast_only


def register_rule(*fn_classes):
    """``register_rule(Cls)(rule)``: set ``Cls.sbp_rule`` from outside the class
    (for a Function defined elsewhere); an op's own rule is written in its class."""
    def deco(rule):
        for cls in fn_classes:
            cls.sbp_rule = staticmethod(rule)
        return rule
    return deco


def _tensors(args):
    # Tensors are what carry a ``_placement`` slot.  This module sits below
    # pyflow.tensor (the ops import it to declare their rules), so it tells
    # them apart by that attribute rather than by class.
    return [a for a in args if hasattr(a, "_placement")]


def broadcast_only(args, n_outputs=1):
    """The signature every op has: everything replicated."""
    return [Candidate((B,) * len(_tensors(args)), (B,) * n_outputs)]


# ---------------------------------------------------------------- elementwise
def _aligned_splits(tensors, out_ndim):
    """For each output dim d: the candidate where every tensor that has d with
    size > 1 is split along its own dim, the others broadcast."""
    cands = []
    for d in range(out_ndim):
        ins, used = [], False
        for t in tensors:
            k = d - (out_ndim - t.ndim)
            if k >= 0 and t.shape[k] != 1:
                ins.append(S(k))
                used = True
            else:
                ins.append(B)
        if used:
            cands.append(Candidate(tuple(ins), (S(d),)))
    return cands


def _out_ndim(tensors):
    return max((t.ndim for t in tensors), default=0)


def elementwise_rule(partial=()):
    """Splits on every output dim, all-B, and the partial-sum signatures in
    ``partial`` (each a tuple of SBPs over the tensor args whose result is P)."""
    def rule(args):
        ts = _tensors(args)
        cands = _aligned_splits(ts, _out_ndim(ts))
        for ins in partial:
            if len(ins) == len(ts):
                cands.append(Candidate(ins, (P,)))
        cands.append(Candidate((B,) * len(ts), (B,)))
        return cands
    return rule


unary_linear_rule = elementwise_rule(partial=[(P,)])
"""A unary op that is linear (cast, clone, neg): P stays P."""


def add_sub_rule(args):
    """P + P is P; P + (a number or a replicated tensor) is not (it adds it n times)."""
    two = len(_tensors(args)) == 2
    return elementwise_rule(partial=[(P, P)] if two else [])(args)


def mul_rule(args):
    """P * B and B * P are P; P * a number is P."""
    two = len(_tensors(args)) == 2
    return elementwise_rule(partial=[(P, B), (B, P)] if two else [(P,)])(args)


def div_rule(args):
    """P / B is P; P / a number is P; a number / P is not."""
    ts = _tensors(args)
    if len(ts) == 2:
        return elementwise_rule(partial=[(P, B)])(args)
    return elementwise_rule(partial=[(P,)] if args[0] is ts[0] else [])(args)


# ---------------------------------------------------------------- matrix products
def matmul_rule(args):
    a, b = args[0], args[1]
    na, nb = a.ndim, b.ndim
    if na < 2 or nb < 2:            # dot, matrix-vector: only the reduced-dim split
        return [Candidate((S(na - 1), S(nb - 2 if nb > 1 else 0)), (P,)),
                Candidate((P, B), (P,)), Candidate((B, P), (P,)), Candidate((B, B), (B,))]
    n_out = max(na, nb)
    c = [Candidate((S(na - 2), B), (S(n_out - 2),)),        # rows of a
         Candidate((B, S(nb - 1)), (S(n_out - 1),)),        # columns of b
         Candidate((S(na - 1), S(nb - 2)), (P,)),           # the reduced dim
         Candidate((P, B), (P,)), Candidate((B, P), (P,))]
    for d in range(n_out - 2):                              # batch dims
        da, db = d - (n_out - na), d - (n_out - nb)
        ia = S(da) if da >= 0 and a.shape[da] != 1 else B
        ib = S(db) if db >= 0 and b.shape[db] != 1 else B
        if ia != B or ib != B:
            c.append(Candidate((ia, ib), (S(d),)))
    c.append(Candidate((B, B), (B,)))
    return c


def linear_rule(args):
    x, bias = args[0], args[2]
    nx = x.ndim
    has_b = bias is not None
    ext = (lambda *s: s) if has_b else (lambda *s: s[:2])
    c = [Candidate(ext(S(d), B, B), (S(d),)) for d in range(nx - 1)]    # batch dims of x
    c += [Candidate(ext(B, S(0), S(0)), (S(nx - 1),)),                  # output features
          Candidate(ext(S(nx - 1), S(1), P), (P,)),                     # input features
          Candidate(ext(P, B, P), (P,)),
          Candidate(ext(B, B, B), (B,))]
    return c


# ---------------------------------------------------------------- reductions
def reduce_rule(linear, mean=False):
    def rule(args):
        x, dims, keepdim = args[0], tuple(args[1]), args[2]
        n = x.ndim
        reduced = set(dims) if dims else set(range(n))
        c = []
        for d in range(n):
            if d in reduced:
                if linear:
                    c.append(Candidate((S(d),), (P,), "mean" if mean else None))
            else:
                out_d = d if keepdim else d - sum(1 for r in reduced if r < d)
                c.append(Candidate((S(d),), (S(out_d),)))
        if linear:
            c.append(Candidate((P,), (P,)))
        c.append(Candidate((B,), (B,)))
        return c
    return rule


def rows_rule(norm_dims):
    """Ops normalizing over ``norm_dims(args)`` of their first input: splits on the
    other dims; extra tensor inputs (weights) replicated."""
    def rule(args):
        ts = _tensors(args)
        x = ts[0]
        keep = [d for d in range(x.ndim) if d not in norm_dims(args)]
        c = []
        for d in keep:
            c.append(Candidate((S(d),) + (B,) * (len(ts) - 1), (S(d),)))
        c.append(Candidate((B,) * len(ts), (B,)))
        return c
    return rule


def _softmax_dims(a):
    dim = a[1] % max(a[0].ndim, 1)      # a causal mask reads each row's position in dim -2 too
    return (dim - 1, dim) if len(a) > 3 and a[3] else (dim,)


softmax_rule = rows_rule(_softmax_dims)
layer_norm_rule = rows_rule(lambda a: tuple(range(a[0].ndim - len(a[3]), a[0].ndim)))


def loss_rule(args):
    """cross_entropy / nll_loss: the target (N, ...) follows the logits' split; class
    weights replicated."""
    x = args[0]
    c = []
    for d in range(x.ndim):
        if d == 1 and x.ndim > 1 or x.ndim == 1:
            continue
        td = d if d == 0 else d - 1
        ins = (S(d), S(td)) + ((B,) if args[2] is not None else ())
        c.append(Candidate(ins, (S(td),)))
    c.append(Candidate((B,) * len(_tensors(args)), (B,)))
    return c


def embedding_rule(args):
    idx = args[1]               # Embedding.apply(weight, indices, ...)
    c = [Candidate((B, S(d)), (S(d),)) for d in range(idx.ndim)]       # split indices
    c.append(Candidate((S(1), B), (S(idx.ndim),)))                       # split columns
    c.append(Candidate((B, B), (B,)))
    return c


# ---------------------------------------------------------------- views
def _dims_map(in_shape, out_shape):
    """For a reshape: {input dim: output dim} for dims that keep their size and
    everything before them (so a split of that dim stays a split of that dim)."""
    mapping, i, j, pi, pj = {}, 0, 0, 1, 1
    ni, no = len(in_shape), len(out_shape)
    while i < ni and j < no:
        if pi == pj and in_shape[i] == out_shape[j]:
            mapping[i] = j
            pi *= in_shape[i]
            pj *= out_shape[j]
            i += 1
            j += 1
        elif pi * in_shape[i] <= pj * out_shape[j]:
            pi *= in_shape[i]
            i += 1
        else:
            pj *= out_shape[j]
            j += 1
    return mapping


def _shrink(shape, d, n):
    shape = list(shape)
    shape[d] //= n
    return tuple(shape)


def view_rule(args):
    x, shape = args[0], tuple(args[1])
    c = []
    for i, j in _dims_map(tuple(x.shape), shape).items():
        c.append(Candidate((S(i),), (S(j),), None,
                           lambda a, n, j=j: (a[0], _shrink(a[1], j, n))))
    c += [Candidate((P,), (P,)), Candidate((B,), (B,))]
    return c


def permute_rule(args):
    x, dims = args[0], tuple(args[1])
    c = [Candidate((S(d),), (S(dims.index(d)),)) for d in range(x.ndim)]
    return c + [Candidate((P,), (P,)), Candidate((B,), (B,))]


def expand_rule(args):
    x, shape = args[0], tuple(args[1])
    lead = len(shape) - x.ndim
    c = [Candidate((S(d),), (S(d + lead),), None,
                   lambda a, n, o=d + lead: (a[0], _shrink(a[1], o, n)))
         for d in range(x.ndim) if x.shape[d] != 1]
    return c + [Candidate((B,), (B,))]


def slice_rule(args):
    """``x[key]`` with a basic key: a dim taken whole (``:``) can stay split."""
    x, key = args[0], args[1]
    c, d_in, d_out = [], 0, 0
    for k in key:
        if k is None:
            d_out += 1
            continue
        if k is Ellipsis:
            break
        if isinstance(k, slice) and k == slice(None):
            c.append(Candidate((S(d_in),), (S(d_out),)))
        d_in += 1
        d_out += 0 if isinstance(k, int) else 1
    else:   # dims after the key are whole too
        rest = x.ndim - d_in
        c += [Candidate((S(d_in + r),), (S(d_out + r),)) for r in range(rest)]
    return c + [Candidate((B,), (B,))]


def split_rule(args):
    """``split`` along dim d: a split on any other dim (or a partial sum: slicing
    is linear) carries over to every piece."""
    x, d, n = args[0], args[1], len(args[2])
    c = [Candidate((S(k),), (S(k),) * n) for k in range(x.ndim) if k != d]
    return c + [Candidate((P,), (P,) * n), Candidate((B,), (B,) * n)]


def cat_rule(args):
    d, ts = args[0], _tensors(args)
    nd = ts[0].ndim
    c = [Candidate((S(k),) * len(ts), (S(k),)) for k in range(nd) if k != d]
    return c + [Candidate((P,) * len(ts), (P,)), Candidate((B,) * len(ts), (B,))]
