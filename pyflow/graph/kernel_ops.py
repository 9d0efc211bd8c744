"""Ops at the level of arrays: what a kernel-level plan calls instead of a Function.

A compiled step (``kernel_plan.py``) runs each node it can lower as one plain
function over arrays: no ``Tensor``, ``Function`` or autograd ``Context`` is
made, every argument that does not change between steps (scalars, shapes,
reduction axes, the kernel itself) is resolved here, once, and the output is
written into a buffer the plan pre-allocated (``out=``) where the plan offers
one.  Each entry below is one op's forward and backward side by side, as the
op's ``Function`` has them at the level of Tensors; ``tests/test_kernel_plan.py``
checks every entry against that Function (values and gradients, broadcasting
included).

A rule is ``rule(node, out, save) -> Lowered | None``:

* ``node``: the ``call`` node (``node.args``: its Values and Python constants);
* ``out(i)``: the plan's buffer for output ``i`` (an array of exactly its shape
  and dtype, the same one every step) or None where it has none; a rule that
  asks for a buffer must write the whole output into it and return it (or a
  view of all of it);
* ``save``: the node's backward is lowered too, so ``forward`` must also return
  what the backward reads (a tuple of arrays, ``saved``).

``Lowered.forward(*arrays)`` takes the arrays of the node's tensor arguments
in order (a state tensor's current data, a constant's data); it returns the
output, or ``(output, saved)`` when ``save``.  ``Lowered.backward(node, out)``
builds the backward for the backward node ``node`` (its ``attrs["slots"]``
say which inputs get a gradient): ``fn(*grads, saved)`` returns one gradient
array per slot (one array when there is one slot).  ``Lowered.keeps`` names
the forward's Values that ``saved`` holds ("in1": ``node.args[1]``, "out0"):
the plan keeps exactly those alive until the backward, as ``passes.memory``
does with what a Function's context keeps.  A rule whose output may view an
input's memory says so with ``rule.views = True``.

A rule returns None when the node is outside what it handles (another dtype
than float32/float64, a global tensor, a tensor nested in a list): the plan
then runs the node's Tensor-level step, which handles everything.
"""
import inspect

import numpy as np

from .. import dtypes as _dt
from .. import ops
from ..kernels import registry
from ..ops.conv import Conv2d, MaxPool2d
from ..ops.dropout import Dropout
from ..ops.elementwise import Add, Div, Mul, Sub, Where, _Unary, eq, ge, gt, le, lt, ne
from ..ops.join import Split
from ..ops.embedding import check_indices, embedding
from ..ops.linalg import Linear, Matmul
from ..ops.loss import CrossEntropy, NLLLoss, TargetWeightSum, check_targets
from ..ops.fused import FusedBiasDropoutAdd, FusedBiasGelu
from ..ops.normalization import FusedAddLayerNorm, LayerNorm, RMSNorm
from ..ops.softmax import LogSoftmax, Softmax
from ..ops.reduce import Mean, Sum
from ..ops.shape import Clone, Permute, SliceView, View, basic_view
from .ir import Value
from .passes.fusion import FusedElementwise

FLOATS = (_dt.float32, _dt.float64)
RULES = {}          # Function class -> rule
FN_RULES = {}       # plain function of an ``fn`` node (a gradient sum) -> rule


class Lowered:
    __slots__ = ("forward", "backward", "keeps")

    def __init__(self, forward, backward=None, keeps=()):
        self.forward = forward
        self.backward = backward
        self.keeps = tuple(keeps)


def lowers(*classes):
    def deco(rule):
        for c in classes:
            RULES[c] = rule
        return rule
    return deco


def rule_for(node):
    """The rule that lowers ``node``, or None."""
    if node.kind == "call":
        rule = RULES.get(node.target)
        if rule is None and isinstance(node.target, type):
            rule = next((RULES[c] for c in _FAMILIES if issubclass(node.target, c)), None)
        return rule
    if node.kind == "fn":
        return FN_RULES.get(node.target)
    return None


# ------------------------------------------------------------------ helpers
def float_operands(node, indices=()):
    """The node's dtype when every tensor argument is a local CPU float32/float64
    Value of one dtype (those at the positions ``indices``: local CPU integer
    Values, class indices), every output too, and no tensor hides in a list or
    in the keyword arguments; else None."""
    values = [a for i, a in enumerate(node.args) if isinstance(a, Value) and i not in indices]
    if not values or any(_nested_value(a) for a in node.args) or \
            any(_nested_value(a) or isinstance(a, Value) for a in node.kwargs.values()):
        return None
    dtype = values[0].dtype
    for v in values + list(node.outputs):
        if v.dtype is not dtype or dtype not in FLOATS or not _local(v):
            return None
    for i in indices:
        v = node.args[i]
        if not isinstance(v, Value) or not _local(v) or v.dtype.category != 1:
            return None
    return dtype


def _local(v):
    return v.placement is None and v.device is not None and v.device.type == "cpu"


def _nested_value(a):
    return isinstance(a, (list, tuple, dict)) and any(
        isinstance(x, Value) or _nested_value(x)
        for x in (a.values() if isinstance(a, dict) else a))


def reduce_to(shape, in_shape):
    """``g`` (of ``shape``) summed down to ``in_shape``, the backward of
    broadcasting (``ops._util.unbroadcast`` at the level of arrays); the
    identity when nothing was broadcast."""
    shape, in_shape = tuple(shape), tuple(in_shape)
    if shape == in_shape:
        return None
    lead = len(shape) - len(in_shape)
    dims = tuple(range(lead)) + tuple(i + lead for i, n in enumerate(in_shape)
                                      if n == 1 and shape[i + lead] != 1)

    def fit(g):
        r = np.sum(g, axis=dims, keepdims=True) if dims else g
        return r.reshape(in_shape) if r.shape != in_shape else r
    return fit


def _fitter(shape, in_shape):
    fit = reduce_to(shape, in_shape)
    return fit if fit is not None else (lambda g: g)


def _array_result(fn, shape):
    """``fn`` whose 0-d result (a NumPy scalar from a ufunc) comes back as an array."""
    if shape != ():
        return fn
    return lambda *a: np.asarray(fn(*a))


def elementwise_kernel(name, dtype):
    """The CPU kernel of elementwise op ``name`` for ``dtype``, specialized now
    when the kernel can be (the ufunc itself: no per-call dispatch)."""
    k = registry.get(name, "cpu")
    spec = getattr(k, "specialize", None)
    return spec(np.dtype(dtype.storage)) if spec is not None else k


def _zeros(v):
    shape, dtype = tuple(v.shape), np.dtype(v.dtype.storage)
    return lambda g, saved: np.zeros(shape, dtype)


def _one_or_tuple(grads):
    return grads[0] if len(grads) == 1 else tuple(grads)


def _backward_of(parts):
    """A backward builder from ``parts[i](g, saved) -> gradient of input i``:
    the gradients of the backward node's slots, in order.  A slot with no part
    (an input the op gives no gradient, as a loss's class weights) gets zeros,
    as the graph's Tensor-level backward step fills in."""
    def build(bnode, out):
        fns = [parts[i] if i < len(parts) and parts[i] is not None else _zeros(v)
               for i, v in zip(bnode.attrs["slots"], bnode.outputs)]
        if len(fns) == 1:
            (f,) = fns
            return lambda g, saved: f(g, saved)
        return lambda g, saved: tuple(f(g, saved) for f in fns)
    return build


# ------------------------------------------------------------------ binary arithmetic
_BINARY = {Add: "add", Sub: "sub", Mul: "mul", Div: "div"}


def _binary_grads(op, a, b, shape, dtype):
    """[grad of a, grad of b] as functions of (g, saved), saved = (x, y) with a
    Python number (as the dtype's scalar) where the operand is one.  The same
    formulas, in the same order, as the Functions' backwards."""
    k = {n: elementwise_kernel(n, dtype) for n in ("mul", "div", "neg")}
    mul, div, neg = k["mul"], k["div"], k["neg"]
    fa = _fitter(shape, a.shape) if isinstance(a, Value) else None
    fb = _fitter(shape, b.shape) if isinstance(b, Value) else None
    if op == "add":
        return [lambda g, s: fa(g), lambda g, s: fb(g)]
    if op == "sub":
        return [lambda g, s: fa(g), lambda g, s: fb(neg(g))]
    if op == "mul":
        return [lambda g, s: fa(mul(g, s[1])), lambda g, s: fb(mul(g, s[0]))]
    return [lambda g, s: fa(div(g, s[1])),
            lambda g, s: fb(neg(div(mul(g, s[0]), mul(s[1], s[1]))))]


def binary_rule(name):
    def rule(node, out, save):
        dtype = float_operands(node)
        if dtype is None or len(node.args) != 2 or node.kwargs:
            return None
        a, b = node.args
        if not all(isinstance(x, Value) or type(x) in (int, float) for x in (a, b)):
            return None
        kern = elementwise_kernel(name, dtype)
        shape = node.outputs[0].shape
        buf = out(0)
        ca = a if isinstance(a, Value) else dtype.compute.type(a)
        cb = b if isinstance(b, Value) else dtype.compute.type(b)
        if isinstance(a, Value) and isinstance(b, Value):
            def run(x, y):
                return kern(x, y, out=buf)
            pair = (lambda x, y: (x, y))
        elif isinstance(a, Value):
            def run(x):
                return kern(x, cb, out=buf)
            pair = (lambda x: (x, cb))
        else:
            def run(y):
                return kern(ca, y, out=buf)
            pair = (lambda y: (ca, y))
        run = _array_result(run, shape) if buf is None else run
        keeps = [f"in{i}" for i, x in enumerate((a, b)) if isinstance(x, Value)] \
            if name in ("mul", "div") else []
        if not save:
            forward = run
        else:
            def forward(*xs):
                return run(*xs), pair(*xs)
        return Lowered(forward, _backward_of(_binary_grads(name, a, b, shape, dtype)), keeps)
    return rule


for _cls, _name in _BINARY.items():
    RULES[_cls] = binary_rule(_name)
FN_RULES[ops.add] = RULES[Add]      # the autograd pass's gradient sums


# ------------------------------------------------------------------ unary (activations)
# d(out)/d(in) from the saved input ("x") or output ("out"), as _Unary.grad computes it
# (fused kernels from kernels/scalar.py for the activations).
_UNARY_GRADS = {
    "relu": "relu_backward", "tanh": "tanh_backward", "sigmoid": "sigmoid_backward",
    "gelu": "gelu_backward", "gelu_tanh": "gelu_tanh_backward", "silu": "silu_backward",
}


def _unary_grad(name, dtype):
    if name in _UNARY_GRADS:
        k = elementwise_kernel(_UNARY_GRADS[name], dtype)
        return lambda g, v: k(g, v)
    mul, neg = elementwise_kernel("mul", dtype), elementwise_kernel("neg", dtype)
    if name == "exp":
        return lambda g, y: mul(g, y)
    if name == "neg":
        return lambda g, v: neg(g)
    return None


def unary_rule(node, out, save):
    cls = node.target
    dtype = float_operands(node)
    if dtype is None or len(node.args) != 1 or node.kwargs:
        return None
    grad = _unary_grad(cls.name, dtype)
    if grad is None:
        return None
    kern = elementwise_kernel(cls.name, dtype)
    buf = out(0)

    def run(x):
        return kern(x, out=buf)
    run = _array_result(run, node.outputs[0].shape) if buf is None else run
    if not save:
        forward = run
    else:
        if cls.save == "x":
            def forward(x):
                return run(x), x
        else:
            def forward(x):
                y = run(x)
                return y, y
    return Lowered(forward, _backward_of([grad]), ["in0" if cls.save == "x" else "out0"])


RULES[_Unary] = unary_rule
_FAMILIES = (_Unary, FusedElementwise)      # rules that cover every subclass


# ------------------------------------------------------------------ fused elementwise
def fused_rule(node, out, save):
    cls = node.target
    dtype = float_operands(node)
    if dtype is None or node.kwargs:
        return None
    kern = registry.get("fused_elementwise", "cpu")
    program, scalars = cls.program, cls.scalars
    consts = [None if isinstance(a, Value) else a for a in node.args]
    where = [i for i, a in enumerate(node.args) if isinstance(a, Value)]
    shape = node.outputs[0].shape
    buf = out(0)
    fwd_expr = (program, scalars, None)

    def operands(xs):
        ops_ = list(consts)
        for i, x in zip(where, xs):
            ops_[i] = x
        return ops_

    def run(*xs):
        return kern(fwd_expr, *operands(xs), out=buf)
    if not save:
        forward = run
    else:
        def forward(*xs):
            return run(*xs), xs
    used = {r for _, refs in program for r in refs}
    same = cls._same_gradient()
    fits = {i: _fitter(shape, node.args[i].shape) for i in where}

    def build(bnode, out_):
        slots = bnode.attrs["slots"]

        def backward(g, xs):
            args = [g] + operands(xs)
            done, grads = {}, []
            for k in slots:
                if k not in used:
                    grads.append(np.zeros(node.args[k].shape, dtype.compute))
                    continue
                full = done.get(same[k])
                if full is None:
                    full = done[same[k]] = np.asarray(kern((program, scalars, k), *args))
                grads.append(fits[k](full))
            return _one_or_tuple(grads)
        return backward
    return Lowered(forward, build, [f"in{i}" for i in where])


RULES[FusedElementwise] = fused_rule


# ------------------------------------------------------------------ linear algebra
def linear_rule(node, out, save):
    dtype = float_operands(node)
    if dtype is None or len(node.args) != 3 or node.kwargs:
        return None
    x, w, b = node.args
    if not isinstance(w, Value) or not (b is None or isinstance(b, Value)) or len(w.shape) != 2:
        return None
    linear, matmul = registry.get("linear", "cpu"), registry.get("matmul", "cpu")
    in_shape = tuple(x.shape)
    rows, out_f = int(np.prod(in_shape[:-1], dtype=np.int64)), w.shape[0]
    out_shape = in_shape[:-1] + (out_f,)
    buf = out(0)
    buf2 = None if buf is None else buf.reshape(rows, out_f)

    if b is None:
        def run(xa, wa):
            return linear(xa.reshape(rows, -1), wa, None, out=buf2).reshape(out_shape)
    else:
        def run(xa, wa, ba):
            return linear(xa.reshape(rows, -1), wa, ba, out=buf2).reshape(out_shape)
    if not save:
        forward = run
    else:
        def forward(xa, wa, *ba):
            return run(xa, wa, *ba), (xa.reshape(rows, -1), wa)
    def gx(g, s):
        return matmul(g.reshape(rows, out_f), s[1]).reshape(in_shape)

    def gw(g, s):
        return matmul(g.reshape(rows, out_f).T, s[0])

    def gb(g, s):
        return np.asarray(np.sum(g.reshape(rows, out_f), axis=0))
    return Lowered(forward, _backward_of([gx, gw, gb]), ["in0", "in1"])


def matmul_rule(node, out, save):
    dtype = float_operands(node)
    if dtype is None or len(node.args) != 2 or node.kwargs or node.target is not Matmul:
        return None
    a, b = node.args
    if not (isinstance(a, Value) and isinstance(b, Value)) or len(a.shape) < 2 or len(b.shape) < 2:
        return None
    matmul = registry.get("matmul", "cpu")
    shape = node.outputs[0].shape
    buf = out(0)

    def run(x, y):
        return matmul(x, y, out=buf)
    if not save:
        forward = run
    else:
        def forward(x, y):
            return run(x, y), (x, y)
    fa, fb = _fitter(shape[:-2] + a.shape[-2:], a.shape), _fitter(shape[:-2] + b.shape[-2:],
                                                                   b.shape)
    return Lowered(forward, _backward_of([
        lambda g, s: fa(matmul(g, np.swapaxes(s[1], -1, -2))),
        lambda g, s: fb(matmul(np.swapaxes(s[0], -1, -2), g))]), ["in0", "in1"])


RULES[Linear] = linear_rule
RULES[Matmul] = matmul_rule


# ------------------------------------------------------------------ reductions
def sum_rule(node, out, save):
    dtype = float_operands(node)
    if dtype is None or node.kwargs:
        return None
    is_sum = node.target is Sum
    if is_sum:
        x, dims, keepdim, out_dtype = node.args
        if out_dtype not in (None, dtype):
            return None
    else:
        x, dims, keepdim = node.args
    in_shape = tuple(x.shape)
    count = int(np.prod([in_shape[d] for d in dims])) if dims else 1
    kern = registry.get("sum" if is_sum else "mean", "cpu")
    div = elementwise_kernel("div", dtype)
    kept = tuple(1 if i in dims else n for i, n in enumerate(in_shape))
    scale = dtype.compute.type(count)

    if is_sum:
        def run(xa):
            return np.asarray(kern(xa, dims, keepdim, dtype.compute))
    else:
        def run(xa):
            return np.asarray(kern(xa, dims, keepdim), dtype.compute)

    def expand(g):
        return np.broadcast_to(g.reshape(kept), in_shape)
    if not save:
        forward = run
    else:
        def forward(xa):
            return run(xa), ()
    grad = expand if is_sum else (lambda g: div(expand(g), scale))
    return Lowered(forward, _backward_of([lambda g, s: grad(g)]))


RULES[Sum] = sum_rule
RULES[Mean] = sum_rule


# ------------------------------------------------------------------ views
def local_operands(node):
    """True when every tensor argument and output is a local CPU Value (any
    dtype: the ops that only move data) and none hides in a list or keywords."""
    values = [a for a in node.args if isinstance(a, Value)] + list(node.outputs)
    return bool(values) and all(_local(v) for v in values) and not node.kwargs and \
        not any(_nested_value(a) for a in node.args)


def view_rule(node, out, save):
    if not local_operands(node):
        return None
    x, shape = node.args
    in_shape = tuple(x.shape)
    shape = tuple(shape)

    def run(xa):
        return xa.reshape(shape)
    if not save:
        forward = run
    else:
        def forward(xa):
            return xa.reshape(shape), ()
    return Lowered(forward, _backward_of([lambda g, s: g.reshape(in_shape)]))


def permute_rule(node, out, save):
    if not local_operands(node):
        return None
    x, dims = node.args
    dims = tuple(dims)
    back = tuple(int(d) for d in np.argsort(dims))

    def run(xa):
        return np.transpose(xa, dims)
    if not save:
        forward = run
    else:
        def forward(xa):
            return np.transpose(xa, dims), ()
    return Lowered(forward, _backward_of([lambda g, s: np.transpose(g, back)]))


def slice_rule(node, out, save):
    """``x[key]`` for a basic key: a view; the backward writes g into zeros."""
    if not local_operands(node):
        return None
    x, key = node.args
    in_shape, np_dtype = tuple(x.shape), np.dtype(x.dtype.storage)

    def run(xa):
        return basic_view(xa, key)
    forward = run if not save else (lambda xa: (basic_view(xa, key), ()))

    def grad(g, s):
        full = np.zeros(in_shape, np_dtype)
        basic_view(full, key)[...] = g
        return full
    return Lowered(forward, _backward_of([grad]))


def split_rule(node, out, save):
    """``split``/``chunk``: views of the pieces; the backward concatenates the
    pieces' gradients (zeros for a piece that got none)."""
    if not local_operands(node):
        return None
    x, dim, sizes = node.args
    lead = (slice(None),) * dim
    keys, start = [], 0
    for size in sizes:
        keys.append(lead + (slice(start, start + size),))
        start += size
    shapes = [tuple(v.shape) for v in node.outputs]
    np_dtype = np.dtype(x.dtype.storage)

    def run(xa):
        return tuple(basic_view(xa, k) for k in keys)
    forward = run if not save else (lambda xa: run(xa) + ((),))

    def build(bnode, out_):
        def backward(*grads_and_saved):
            grads = [np.zeros(s, np_dtype) if g is None else g
                     for g, s in zip(grads_and_saved[:-1], shapes)]
            return np.concatenate(grads, axis=dim)
        return backward
    return Lowered(forward, build)


def clone_rule(node, out, save):
    """A C-contiguous copy (``contiguous()``); its gradient passes through."""
    if not local_operands(node):
        return None
    buf = out(0)

    if buf is None:
        def run(xa):
            return np.array(xa, copy=True, order="C")
    else:
        def run(xa):
            np.copyto(buf, xa)
            return buf
    forward = run if not save else (lambda xa: (run(xa), ()))
    return Lowered(forward, _backward_of([lambda g, s: g]))


view_rule.views = permute_rule.views = slice_rule.views = split_rule.views = True
RULES[View] = view_rule
RULES[Permute] = permute_rule
RULES[SliceView] = slice_rule
RULES[Split] = split_rule
RULES[Clone] = clone_rule


# ------------------------------------------------------------------ select, compare
def where_rule(node, out, save):
    """``where(cond, a, b)`` (masked_fill is one): a and b tensors or numbers."""
    cond, a, b = node.args
    if node.kwargs or not isinstance(cond, Value) or not _local(cond) or \
            cond.dtype.name != "bool":
        return None
    values = [v for v in (a, b) if isinstance(v, Value)]
    if not values or not all(_local(v) and v.dtype is values[0].dtype for v in values) or \
            values[0].dtype not in FLOATS or \
            not all(isinstance(v, Value) or type(v) in (int, float) for v in (a, b)):
        return None
    dtype = values[0].dtype
    if node.outputs[0].dtype is not dtype:
        return None
    kern = registry.get("where", "cpu")
    zero = dtype.compute.type(0.0)
    ca = a if isinstance(a, Value) else dtype.compute.type(a)
    cb = b if isinstance(b, Value) else dtype.compute.type(b)
    shape = node.outputs[0].shape
    buf = out(0)

    def operands(xs):
        it = iter(xs)
        c = next(it)
        return c, (next(it) if isinstance(a, Value) else ca), \
            (next(it) if isinstance(b, Value) else cb)

    def run(*xs):
        c, x, y = operands(xs)
        return kern(c, x, y, out=buf)
    run = _array_result(run, shape) if buf is None else run
    forward = run if not save else (lambda *xs: (run(*xs), xs[0]))
    fa = _fitter(shape, a.shape) if isinstance(a, Value) else None
    fb = _fitter(shape, b.shape) if isinstance(b, Value) else None
    return Lowered(forward, _backward_of([
        None, lambda g, c: fa(kern(c, g, zero)), lambda g, c: fb(kern(c, zero, g))]), ["in0"])


def compare_rule(node, out, save):
    """A comparison of a float tensor with a tensor of its dtype or a number: a
    bool result, no gradient."""
    a, b = node.args
    name = node.target.__name__
    if node.kwargs or not isinstance(a, Value) or not _local(a) or a.dtype not in FLOATS or \
            not (isinstance(b, Value) and _local(b) and b.dtype is a.dtype
                 or type(b) in (int, float)) or save:
        return None
    kern = elementwise_kernel(name, a.dtype)
    cb = b if isinstance(b, Value) else a.dtype.compute.type(b)
    if isinstance(b, Value):
        run = _array_result(lambda x, y: kern(x, y), node.outputs[0].shape)
    else:
        run = _array_result(lambda x: kern(x, cb), node.outputs[0].shape)
    return Lowered(run)


RULES[Where] = where_rule
for _compare in (eq, ne, lt, le, gt, ge):
    FN_RULES[_compare.__wrapped__] = compare_rule


# ------------------------------------------------------------------ normalization, softmax
def layer_norm_rule(node, out, save):
    dtype = float_operands(node)
    if dtype is None or node.kwargs or len(node.args) != 5:
        return None
    x, w, b, normalized_shape, eps = node.args
    if w is None and b is not None:
        return None
    k = len(normalized_shape)
    shape = tuple(x.shape)
    rows, cols = int(np.prod(shape[:len(shape) - k], dtype=np.int64)), \
        int(np.prod(shape[len(shape) - k:], dtype=np.int64))
    nshape = shape[len(shape) - k:]
    fwd, bwd = registry.get("layer_norm", "cpu"), registry.get("layer_norm_backward", "cpu")

    def run(xa, *wb):
        wa, ba = (wb + (None, None))[:2]
        out_, mean, rstd = fwd(xa.reshape(rows, cols), wa, ba, eps)
        return out_.reshape(shape), mean, rstd
    if save:
        def forward(xa, *wb):
            y, mean, rstd = run(xa, *wb)
            return y, (xa, wb[0] if wb else None, mean, rstd)
    else:
        def forward(xa, *wb):
            return run(xa, *wb)[0]

    def build(bnode, out_):
        slots = bnode.attrs["slots"]

        def backward(g, saved):
            xa, wa, mean, rstd = saved
            dx, dw, db = bwd(g.reshape(rows, cols), xa.reshape(rows, cols), mean, rstd, wa)
            grads = {0: dx.reshape(shape), 1: dw.reshape(nshape), 2: db.reshape(nshape)}
            return _one_or_tuple([grads[i] for i in slots])
        return backward
    return Lowered(forward, build, ["in0", "in1"] if w is not None else ["in0"])


def softmax_rule(node, out, save):
    dtype = float_operands(node)
    if dtype is None or node.kwargs or not 2 <= len(node.args) <= 4:
        return None
    x, dim, scale, causal = (tuple(node.args) + (1.0, False))[:4]
    log = node.target.log
    if causal and log:
        return None
    fwd = registry.get("log_softmax" if log else "softmax", "cpu")
    bwd = registry.get("log_softmax_backward" if log else "softmax_backward", "cpu")

    def run(xa):
        return fwd(xa, dim, scale=scale, causal=causal)
    if not save:
        forward = run
    else:
        def forward(xa):
            y = run(xa)
            return y, y

    def grad(g, y):
        return bwd(g, y, dim, scale=scale, causal=causal)
    return Lowered(forward, _backward_of([grad]), ["out0"])


RULES[LayerNorm] = layer_norm_rule


def _rows_cols(shape, k):
    """(rows, cols) of ``shape`` with its last ``k`` dims flattened into cols."""
    lead, tail = shape[:len(shape) - k], shape[len(shape) - k:]
    return int(np.prod(lead, dtype=np.int64)), int(np.prod(tail, dtype=np.int64))


@lowers(RMSNorm)
def rms_norm_rule(node, out, save):
    dtype = float_operands(node)
    if dtype is None or node.kwargs or len(node.args) != 4:
        return None
    x, w, normalized_shape, eps = node.args
    shape = tuple(x.shape)
    nshape = tuple(normalized_shape)
    rows, cols = _rows_cols(shape, len(nshape))
    fwd, bwd = registry.get("rms_norm", "cpu"), registry.get("rms_norm_backward", "cpu")

    def forward(xa, wa=None):
        y, rstd = fwd(xa.reshape(rows, cols), wa, eps)
        return (y.reshape(shape), (xa, wa, rstd)) if save else y.reshape(shape)

    def build(bnode, out_):
        slots = bnode.attrs["slots"]

        def backward(g, saved):
            xa, wa, rstd = saved
            dx, dw = bwd(g.reshape(rows, cols), xa.reshape(rows, cols), rstd, wa)
            grads = {0: dx.reshape(shape), 1: dw.reshape(nshape)}
            return _one_or_tuple([grads[i] for i in slots])
        return backward
    return Lowered(forward, build, ["in0", "in1"] if w is not None else ["in0"])


@lowers(FusedAddLayerNorm)
def add_layer_norm_rule(node, out, save):
    """Two outputs, the norm and the sum; the backward takes either gradient or both."""
    dtype = float_operands(node)
    if dtype is None or node.kwargs or len(node.args) != 6:
        return None
    a, r, w, b, normalized_shape, eps = node.args
    if w is None and b is not None:
        return None
    shape = tuple(a.shape)
    nshape = tuple(normalized_shape)
    rows, cols = _rows_cols(shape, len(nshape))
    fwd = registry.get("add_layer_norm", "cpu")
    bwd = registry.get("add_layer_norm_backward", "cpu")

    def forward(aa, ra, *wb):
        wa, ba = (wb + (None, None))[:2]
        y, total, mean, rstd = fwd(aa.reshape(rows, cols), ra.reshape(rows, cols), wa, ba, eps)
        outs = (y.reshape(shape), total.reshape(shape))
        return outs + ((total, wa, mean, rstd),) if save else outs

    def build(bnode, out_):
        slots = bnode.attrs["slots"]

        def backward(g_out, g_sum, saved):
            total, wa, mean, rstd = saved
            dw = db = None
            if g_out is None:
                ds = g_sum
            else:
                ds, dw, db = bwd(g_out.reshape(rows, cols),
                                 None if g_sum is None else g_sum.reshape(rows, cols),
                                 total, mean, rstd, wa)
                ds = ds.reshape(shape)
            zeros = np.zeros(nshape, np.dtype(dtype.storage))
            grads = {0: ds, 1: ds,
                     2: zeros if dw is None else dw.reshape(nshape),
                     3: zeros if db is None else db.reshape(nshape)}
            return _one_or_tuple([grads[i] for i in slots])
        return backward
    return Lowered(forward, build)


@lowers(FusedBiasGelu)
def bias_gelu_rule(node, out, save):
    dtype = float_operands(node)
    if dtype is None or node.kwargs or len(node.args) != 3:
        return None
    x, b, approximate = node.args
    fwd = registry.get("bias_gelu", "cpu")
    bwd = registry.get("bias_gelu_backward", "cpu")

    def forward(xa, ba):
        y = fwd(xa, ba, approximate)
        return (y, (xa, ba)) if save else y

    def build(bnode, out_):
        slots = bnode.attrs["slots"]

        def backward(g, saved):
            dx, db = bwd(g, *saved, approximate)
            return _one_or_tuple([(dx, db)[i] for i in slots])
        return backward
    return Lowered(forward, build, ["in0", "in1"])
RULES[Softmax] = RULES[LogSoftmax] = softmax_rule


# ------------------------------------------------------------------ class-index losses
def cross_entropy_rule(node, out, save):
    """CrossEntropy and NLLLoss: per-row losses of (N, C) scores at class
    indices, which are checked on every call, as the Functions do."""
    dtype = float_operands(node, indices=(1,))
    if dtype is None or node.kwargs:
        return None
    is_ce = node.target is CrossEntropy
    x, target, weight = node.args[:3]
    ignore_index = node.args[3]
    smoothing = node.args[4] if is_ce else None
    C = x.shape[1]
    op = "cross_entropy" if is_ce else "nll_loss"
    fwd = registry.get(op, "cpu")
    bwd = registry.get(op + "_backward", "cpu")

    def targets(ta):
        return check_targets(ta.reshape(-1).astype(np.int64, copy=False), C, ignore_index, op)
    if is_ce:
        def run(xa, ta, wa=None):
            t = targets(ta)
            loss, lse = fwd(xa, t, wa, ignore_index, smoothing)
            return loss, (xa, t, wa, lse)

        def grad(g, s):
            xa, t, wa, lse = s
            return bwd(g, xa, t, wa, ignore_index, smoothing, lse)
    else:
        def run(xa, ta, wa=None):
            t = targets(ta)
            return fwd(xa, t, wa, ignore_index), (xa, t, wa, None)

        def grad(g, s):
            return bwd(g, s[1], s[2], ignore_index, C)
    forward = run if save else (lambda *a: run(*a)[0])
    keeps = ["in0", "in1"] + (["in2"] if isinstance(weight, Value) else [])  # (t views targets)
    return Lowered(forward, _backward_of([grad]), keeps)


def target_weight_sum_rule(node, out, save):
    """The 'mean' denominator: the weight of the targets kept (their count)."""
    target, weight, ignore_index, dtype = node.args
    if weight is not None or not isinstance(target, Value) or not _local(target) or \
            target.dtype.category != 1 or dtype not in FLOATS or node.kwargs:
        return None
    np_dtype = dtype.compute

    def forward(ta):
        t = ta.reshape(-1)
        return np.asarray(np.count_nonzero(t != ignore_index), np_dtype)
    return Lowered(forward if not save else (lambda ta: (forward(ta), ())),
                   _backward_of([lambda g, s: None] * 4))


RULES[CrossEntropy] = RULES[NLLLoss] = cross_entropy_rule
RULES[TargetWeightSum] = target_weight_sum_rule


# ------------------------------------------------------------------ convolution, pooling
def conv2d_rule(node, out, save):
    dtype = float_operands(node)
    if dtype is None or node.kwargs or len(node.args) != 5:
        return None
    x, w, b, geo, keep_cols = node.args
    conv, conv_bwd = registry.get("conv2d", "cpu"), registry.get("conv2d_backward", "cpu")
    has_bias = b is not None

    def run(xa, wa, ba=None):
        y, cols = conv(xa, wa, ba, geo.stride, geo.padding, geo.dilation, geo.groups,
                       geo.out_hw, keep_cols)
        return y, (xa, wa, cols)
    forward = run if save else (lambda *a: run(*a)[0])

    def build(bnode, out_):
        slots = bnode.attrs["slots"]
        need_x, need_w, need_b = (0 in slots), (1 in slots), (2 in slots and has_bias)

        def backward(gy, saved):
            xa, wa, cols = saved
            grads = conv_bwd(xa if need_w and cols is None else None, wa if need_x else None,
                             gy, cols, geo.x_shape, geo.w_shape, geo.stride, geo.padding,
                             geo.dilation, geo.groups, need_x, need_w, need_b)
            return _one_or_tuple([grads[i] for i in slots])
        return backward
    return Lowered(forward, build, ["in0", "in1"])


def max_pool2d_rule(node, out, save):
    """Two outputs: the pooled values and the int64 positions they came from."""
    x = node.args[0]
    if not isinstance(x, Value) or not _local(x) or x.dtype not in FLOATS or node.kwargs or \
            any(isinstance(a, Value) for a in node.args[1:]) or \
            not all(_local(v) for v in node.outputs):
        return None
    _, k, st, p, d, out_hw = node.args
    pool, scatter = registry.get("max_pool2d", "cpu"), registry.get("pool_scatter", "cpu")
    in_hw = tuple(x.shape[-2:])

    def run(xa):
        return pool(xa, k, st, p, d, out_hw)
    if save:
        def forward(xa):
            y, idx = run(xa)
            return y, idx, idx
    else:
        forward = run

    def grad(g, idx):
        return scatter(g, idx, in_hw)
    return Lowered(forward, lambda bnode, out_: (lambda g, _g_idx, idx: grad(g, idx)), ["out1"])


RULES[Conv2d] = conv2d_rule
RULES[MaxPool2d] = max_pool2d_rule


# ------------------------------------------------------------------ dropout, embedding
def dropout_rule(node, out, save):
    """Dropout with the seed its ``seed`` node draws every run."""
    x, p, seed = node.args
    if not isinstance(x, Value) or not _local(x) or x.dtype not in FLOATS or node.kwargs:
        return None
    drop, masked = registry.get("dropout_philox", "cpu"), registry.get("dropout", "cpu")
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    seeded = isinstance(seed, Value)

    def run(xa, s=None):
        return drop(xa, p, s if seeded else seed)
    forward = (lambda *a: run(*a)[0]) if not save else run
    return Lowered(forward, _backward_of([lambda g, keep: masked(g, keep, scale)]))


@lowers(FusedBiasDropoutAdd)
def bias_dropout_add_rule(node, out, save):
    """``(x + bias) * keep * scale + residual`` with the seed its ``seed`` node
    draws every run; bias and residual may be None."""
    x, bias, residual, p, seed = node.args
    tensors = [v for v in (x, bias, residual) if v is not None]
    if any(not isinstance(v, Value) or not _local(v) or v.dtype is not x.dtype
           for v in tensors) or x.dtype not in FLOATS or node.kwargs \
            or not isinstance(seed, Value):
        return None
    run = registry.get("bias_dropout_add_philox", "cpu")
    masked = registry.get("dropout", "cpu")
    with_bias = registry.get("dropout_bias_backward", "cpu")
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    has_b, has_r = bias is not None, residual is not None

    def forward(xa, *rest):
        ba = rest[0] if has_b else None
        ra = rest[int(has_b)] if has_r else None
        y, keep = run(xa, ba, ra, p, rest[-1])
        return (y, keep) if save else y

    def build(bnode, out_):
        slots = bnode.attrs["slots"]

        def backward(g, keep):
            if 1 in slots:
                dx, db = with_bias(g, keep, scale)
            else:
                dx, db = masked(g, keep, scale), None
            return _one_or_tuple([{0: dx, 1: db, 2: g}[i] for i in slots])
        return backward
    return Lowered(forward, build)


def embedding_rule(node, out, save):
    """``embedding`` is recorded whole (it checks its indices on the host): the
    same check on every call, then the row gather; the backward scatters."""
    try:
        bound = _EMBEDDING_SIGNATURE.bind(*node.args, **node.kwargs).arguments
    except TypeError:
        return None
    idx, weight = bound.get("input"), bound.get("weight")
    padding_idx = bound.get("padding_idx")
    if not isinstance(idx, Value) or not isinstance(weight, Value) or not _local(idx) or \
            not _local(weight) or idx.dtype.category != 1 or weight.dtype not in FLOATS or \
            bound.get("max_norm") is not None or len(weight.shape) != 2 or \
            [v.id for v in node.inputs] != [idx.id, weight.id]:
        return None
    num = weight.shape[0]
    if padding_idx is not None:
        padding_idx = padding_idx % num if -num <= padding_idx < num else None
        if padding_idx is None:
            return None
    freq = bool(bound.get("scale_grad_by_freq", False))
    gather, scatter = registry.get("embedding", "cpu"), registry.get("embedding_backward", "cpu")
    wshape = tuple(weight.shape)

    def run(ia, wa):
        check_indices(ia, wshape)
        i64 = ia.astype(np.int64, copy=False)
        return gather(wa, i64), i64
    forward = run if save else (lambda ia, wa: run(ia, wa)[0])

    def grad_weight(g, i64):
        return scatter(g, i64, num, -1 if padding_idx is None else padding_idx, freq)
    return Lowered(forward, _backward_of([None, grad_weight]), ["in0"])


_EMBEDDING_SIGNATURE = inspect.signature(embedding.__wrapped__)
RULES[Dropout] = dropout_rule
FN_RULES[embedding.__wrapped__] = embedding_rule
