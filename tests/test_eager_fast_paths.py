"""The eager fast paths (issue 16): common calls of add, sub, mul, div, the unary
ops, sum, view/reshape, t/transpose, expand, slices, matmul and linear run their
Function's forward work without ``Function.apply`` (and record the call
themselves when an input requires grad).  Each must give what the general path
gives: values, dtype, shape, strides of views, the recorded node and the
gradients; and a call just outside its conditions must still go the general
way (``Function.apply``) and be right.

The general path is forced by making the calling thread look like a graph
trace inside an op (``depth`` 1): the fast paths step aside for any trace, and
every tracing hook passes such a call straight through.
"""
import contextlib
import gc
import weakref

import numpy as np
import pytest

import pyflow as pf
from pyflow import _hooks
from pyflow.autograd import Function
from pyflow.ops import shape as shape_ops
from tests.helpers import assert_close


class _InsideAnOp:
    depth = 1       # a tracer running an op's insides: every hook calls the plain op


@contextlib.contextmanager
def general_path():
    _hooks.set_active(_InsideAnOp())
    try:
        yield
    finally:
        _hooks.set_active(None)


@pytest.fixture
def applied(monkeypatch):
    """The names of the Functions that went through ``Function.apply``."""
    calls = []
    original = Function.__dict__["apply"].__func__

    def counting(cls, *args, **kwargs):
        calls.append(cls.__name__)
        return original(cls, *args, **kwargs)
    monkeypatch.setattr(Function, "apply", classmethod(counting))
    return calls


def _tensor(shape, dtype=np.float32, seed=0, requires_grad=False, low=None):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind == "b":
        data = rng.integers(0, 2, shape).astype(bool)
    elif np.dtype(dtype).kind == "i":
        data = rng.integers(1 if low else -5, 6, shape).astype(dtype)
    else:
        data = rng.standard_normal(shape).astype(dtype)
    return pf.tensor(data, requires_grad=requires_grad)


def _same_tensor(fast, slow):
    assert fast.dtype is slow.dtype
    assert tuple(fast.shape) == tuple(slow.shape)
    assert fast.requires_grad == slow.requires_grad
    assert fast.device == slow.device
    np.testing.assert_array_equal(fast.detach().numpy(), slow.detach().numpy())


def _leaves(args):
    return [a for a in args if isinstance(a, pf.Tensor) and a.requires_grad]


def _check(op, *args, fast=True, applied=None):
    """``op(*args)`` on the fast and the general path: the same result, the same
    recorded node, the same gradients; ``fast`` says which path the plain call
    must take (checked through ``applied``; None: either)."""
    leaves = _leaves(args)
    del applied[:]
    out = op(*args)
    took_fast = not applied
    with general_path():
        ref = op(*args)
    assert fast is None or took_fast == fast, (op, applied)
    _same_tensor(out, ref)
    if out.requires_grad:
        assert out.grad_fn.fn is ref.grad_fn.fn
        assert out.grad_fn.ctx.needs_input_grad == ref.grad_fn.ctx.needs_input_grad
        assert [e and (type(e[0]), e[1]) for e in out.grad_fn.edges] == \
            [e and (type(e[0]), e[1]) for e in ref.grad_fn.edges]
        g = _tensor(tuple(out.shape), np.float32 if out.dtype is pf.float32 else np.float64,
                    seed=7)
        grads = pf.autograd.grad(out, leaves, g)
        with general_path():
            ref_grads = pf.autograd.grad(ref, leaves, g)
        for a, b in zip(grads, ref_grads):
            _same_tensor(a, b)
    return out


# ------------------------------------------------------------------ elementwise
@pytest.mark.parametrize("op", [pf.add, pf.sub, pf.mul, pf.div])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("grad", ["none", "a", "b", "both"])
def test_binary_ops_of_one_dtype_and_shape(applied, op, dtype, grad):
    a = _tensor((4, 5), dtype, 1, requires_grad=grad in ("a", "both"))
    b = _tensor((4, 5), dtype, 2, requires_grad=grad in ("b", "both"))
    _check(op, a, b, applied=applied)


@pytest.mark.parametrize("op", [pf.add, pf.sub, pf.mul])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_add_sub_mul_stay_integer(applied, op, dtype):
    out = _check(op, _tensor((3, 4), dtype, 1), _tensor((3, 4), dtype, 2), applied=applied)
    assert out.dtype is {np.int32: pf.int32, np.int64: pf.int64}[dtype]


@pytest.mark.parametrize("op", [pf.add, pf.mul])
def test_bool_add_and_mul(applied, op):
    out = _check(op, _tensor((6,), bool, 1), _tensor((6,), bool, 2), applied=applied)
    assert out.dtype is pf.bool


@pytest.mark.parametrize("fn", [lambda a: a * 2.0, lambda a: a + 3, lambda a: a - 0.5,
                                lambda a: a / 4.0, lambda a: 2.0 * a, lambda a: 1 + a,
                                lambda a: 2.0 - a, lambda a: 3.0 / a])
@pytest.mark.parametrize("grad", [False, True])
def test_float_tensor_and_python_number(applied, fn, grad):
    _check(fn, _tensor((3, 4), requires_grad=grad), applied=applied)


@pytest.mark.parametrize("fn", [lambda a: a * 3, lambda a: a + 2, lambda a: a - 7,
                                lambda a: 5 - a, lambda a: 2 * a])
def test_integer_tensor_and_python_int(applied, fn):
    out = _check(fn, _tensor((3, 4), np.int64), applied=applied)
    assert out.dtype is pf.int64


def test_broadcasting_operands_and_their_gradients(applied):
    a = _tensor((4, 1, 3), requires_grad=True)
    b = _tensor((5, 1), seed=3, requires_grad=True)
    for op in (pf.add, pf.sub, pf.mul, pf.div):
        out = _check(op, a, b, applied=applied)
        assert tuple(out.shape) == (4, 5, 3)


def test_shapes_that_do_not_broadcast_raise_the_general_error(applied):
    with pytest.raises(RuntimeError, match="not broadcastable"):
        pf.add(_tensor((3,)), _tensor((4,)))


def test_zero_dim_operands(applied):
    out = _check(pf.mul, _tensor(()), _tensor((), seed=1), applied=applied)
    assert out.ndim == 0 and isinstance(out._data, np.ndarray)
    out = _check(lambda a: a + 1.0, _tensor((), requires_grad=True), applied=applied)
    assert out.ndim == 0


@pytest.mark.parametrize("case", [
    ("mixed float dtypes", lambda: pf.add(_tensor((3,)), _tensor((3,), np.float64)), pf.float64),
    ("int tensor, float number", lambda: _tensor((3,), np.int64) * 2.5, pf.float32),
    ("int / int", lambda: pf.div(_tensor((3,), np.int64), _tensor((3,), np.int64, low=1)),
     pf.float32),
    ("bool tensor, int number", lambda: _tensor((3,), bool) + 1, pf.int64),
    ("float16", lambda: pf.add(_tensor((3,), np.float16), _tensor((3,), np.float16)),
     pf.float16),
    ("numpy scalar", lambda: _tensor((3,)) * np.float64(2.0), pf.float32),
    ("Python bool", lambda: _tensor((3,)) * True, pf.float32),
])
def test_just_outside_the_binary_fast_path(applied, case):
    name, fn, dtype = case
    del applied[:]
    out = fn()
    assert applied, f"{name}: should take the general path"
    with general_path():
        ref = fn()
    assert out.dtype is dtype
    _same_tensor(out, ref)


def test_bool_subtraction_still_raises_pytorchs_error(applied):
    with pytest.raises(RuntimeError, match="Subtraction, the `-` operator, with two bool"):
        _tensor((3,), bool) - _tensor((3,), bool, seed=1)


@pytest.mark.parametrize("name", ["relu", "neg", "abs", "exp", "tanh", "sigmoid", "sqrt", "gelu"])
@pytest.mark.parametrize("grad", [False, True])
def test_unary_ops_of_float_tensors(applied, name, grad):
    x = pf.tensor(np.abs(np.random.default_rng(0).standard_normal((3, 4))).astype(np.float32)
                  - 0.5 * (name != "sqrt"), requires_grad=grad)
    _check(getattr(pf, name), x, applied=applied)


def test_unary_ops_just_outside(applied):
    out = _check(pf.relu, _tensor((5,), np.int64), applied=applied)      # int relu: fast
    assert out.dtype is pf.int64
    _check(pf.exp, _tensor((5,), np.int64), fast=False, applied=applied)  # int -> float
    _check(pf.abs, _tensor((5,), np.float16), fast=False, applied=applied)
    with pytest.raises(RuntimeError, match="Boolean inputs not supported for relu"):
        pf.relu(_tensor((3,), bool))
    with pytest.raises(NotImplementedError, match="gelu"):
        pf.nn.functional.gelu(_tensor((3,), np.int64))


def test_an_input_requiring_grad_under_no_grad_records_nothing(applied):
    a = _tensor((3,), requires_grad=True)
    with pf.no_grad():
        out = a * 2.0 + a
    assert not applied and not out.requires_grad and out.grad_fn is None


# ------------------------------------------------------------------ sum
@pytest.mark.parametrize("dim", [None, 0, 1, -1])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_sum_over_all_or_one_dim(applied, dim, keepdim, grad):
    _check(lambda x: x.sum(dim, keepdim=keepdim), _tensor((3, 4), requires_grad=grad),
           applied=applied)


@pytest.mark.parametrize("dtype", [np.int32, bool])
def test_sum_of_integers_and_bools_is_int64(applied, dtype):
    out = _check(lambda x: x.sum(), _tensor((3, 4), dtype), applied=applied)
    assert out.dtype is pf.int64


@pytest.mark.parametrize("fn", [lambda x: x.sum((0, 1)), lambda x: x.sum(dtype=pf.float64),
                                lambda x: x.sum(np.int64(0))])
def test_sum_just_outside(applied, fn):
    _check(fn, _tensor((3, 4), requires_grad=True), fast=False, applied=applied)
    _check(lambda x: x.sum(), _tensor((), requires_grad=True), fast=False, applied=applied)
    with pytest.raises(IndexError, match="out of range"):
        _tensor((3, 4)).sum(2)


# ------------------------------------------------------------------ views
@pytest.mark.parametrize("fn", [lambda x: x.view(12), lambda x: x.view(-1), lambda x: x.view(2, -1),
                                lambda x: x.view((4, 3)), lambda x: x.view(x.shape),
                                lambda x: x.reshape(6, 2), lambda x: x.reshape(-1, 4),
                                lambda x: x.t(), lambda x: x.transpose(0, 1),
                                lambda x: x.transpose(-1, -2), lambda x: x.expand(2, 3, 4),
                                lambda x: x.permute(1, 0), lambda x: x.unsqueeze(1),
                                lambda x: x.unsqueeze(0).squeeze(0), lambda x: x.narrow(1, 1, 2),
                                lambda x: x.select(0, 1),
                                lambda x: shape_ops.slice_view(x, (slice(1, 3),)),
                                lambda x: shape_ops.slice_view(x, (1, slice(None, None, 2)))])
@pytest.mark.parametrize("grad", [False, True])
def test_views(applied, fn, grad):
    x = _tensor((3, 4), requires_grad=grad)
    out = _check(fn, x, applied=applied)
    with general_path():
        ref = fn(x)
    assert out.stride() == ref.stride() and out._version is x._version
    assert out._base is x


def test_views_just_outside(applied):
    x = _tensor((3, 4), requires_grad=True)
    # a non-contiguous input: view refuses with the general path's error, reshape copies
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        x.t().view(12)
    _check(lambda x: x.t().reshape(12), x, fast=False, applied=applied)
    with pytest.raises(RuntimeError, match="invalid for input of size 12"):
        x.view(5, -1)
    _check(lambda x: x.view(np.int64(12)), x, fast=False, applied=applied)
    _check(lambda x: x.transpose(np.int64(0), 1), x, fast=False, applied=applied)
    with pytest.raises(IndexError, match="out of range"):
        x.transpose(0, 2)


def test_identity_views_of_a_tensor_that_requires_grad_keep_the_gradient():
    """t() of a vector and transpose/movedim of a 0-d tensor are the tensor itself,
    as a view; they used to come back without grad (the gradient was lost)."""
    v = pf.tensor([1.0, 2.0, 3.0], requires_grad=True)
    s = pf.tensor(2.0, requires_grad=True)
    for y, x in ((v.t(), v), (s.t(), s), (s.transpose(0, -1), s), (s.movedim(0, 0), s)):
        assert y.requires_grad and y._version is x._version
        x.grad = None
        (y * 3.0).sum().backward()
        assert_close(x.grad, np.full(tuple(x.shape), 3.0))
    u = pf.tensor([1.0, 2.0])
    assert not u.t().requires_grad and u.t()._base is u


# ------------------------------------------------------------------ matmul, linear
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
@pytest.mark.parametrize("grad", ["none", "a", "b"])
def test_matmul_of_two_matrices(applied, dtype, grad):
    if dtype is np.int64 and grad != "none":
        return
    a = _tensor((3, 5), dtype, 1, requires_grad=grad == "a")
    b = _tensor((5, 2), dtype, 2, requires_grad=grad == "b")
    _check(pf.matmul, a, b, applied=applied)


def test_matmul_just_outside(applied):
    a, b = _tensor((3, 5), requires_grad=True), _tensor((5, 2), seed=1)
    _check(pf.matmul, a, b.to(pf.float64), fast=False, applied=applied)     # mixed dtypes
    _check(pf.matmul, _tensor((2, 3, 5)), b, fast=False, applied=applied)    # batched
    # matrix @ vector: unsqueeze, a 2-D product and squeeze, each on its own path
    _check(pf.matmul, a, _tensor((5,)), fast=None, applied=applied)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        pf.matmul(a, _tensor((4, 2)))
    with pytest.raises(RuntimeError, match="not implemented for bool"):
        pf.matmul(_tensor((2, 2), bool), _tensor((2, 2), bool))


@pytest.mark.parametrize("shape", [(4, 5), (2, 3, 5), (5,)])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_linear(applied, shape, bias, grad):
    x = _tensor(shape, requires_grad=grad)
    w = _tensor((3, 5), seed=1, requires_grad=grad)
    b = _tensor((3,), seed=2, requires_grad=grad) if bias else None
    _check(lambda x, w: pf.nn.functional.linear(x, w, b), x, w, applied=applied)
    if grad and bias:   # the bias gradient too
        out = pf.nn.functional.linear(x, w, b)
        (gb,) = pf.autograd.grad(out.sum(), [b])
        assert_close(gb, np.full(3, float(np.prod(shape[:-1]))))


def test_linear_just_outside(applied):
    w = _tensor((3, 5), seed=1, requires_grad=True)
    x = _tensor((5, 4)).t()                                              # non-contiguous
    _check(lambda x, w: pf.nn.functional.linear(x, w), x, w, fast=False, applied=applied)
    _check(lambda x, w: pf.nn.functional.linear(x, w, _tensor((1,))), _tensor((4, 5)), w,
           fast=False, applied=applied)                                   # broadcast bias


# ------------------------------------------------------------------ autograd
def test_forward_and_backward_of_mul_and_sum_match_the_general_path():
    a = _tensor((16, 16), requires_grad=True)
    b = _tensor((16, 16), seed=1)
    for _ in range(2):                  # the second backward accumulates into .grad
        (a * b).sum().backward()
    fast = a.grad.numpy().copy()
    a.grad = None
    with general_path():
        for _ in range(2):
            (a * b).sum().backward()
    np.testing.assert_array_equal(fast, a.grad.numpy())
    assert_close(a.grad, 2 * b.numpy())


def test_a_read_only_grad_still_refuses_accumulation():
    a = _tensor((3,), requires_grad=True)
    a.grad = pf.zeros(1).expand(3)          # read-only memory: add_ cannot write it
    with pytest.raises(ValueError, match="read-only"):
        (a * 2.0).sum().backward()


def test_an_op_that_saves_its_output_makes_no_reference_cycle():
    """relu, exp, tanh... save their output for backward: the output refers to
    its node and the node (its ctx) referred to the output, a cycle that kept
    every such activation alive until the garbage collector ran."""
    gc.disable()
    try:
        x = _tensor((64, 64), requires_grad=True)
        for op in (pf.relu, pf.exp, pf.tanh, pf.sigmoid, pf.sqrt):
            y = op(x.abs())
            dead, node = weakref.ref(y), weakref.ref(y.grad_fn)
            del y
            assert dead() is None and node() is None, op
    finally:
        gc.enable()


def test_saved_outputs_are_outputs_of_their_node_again_in_backward():
    """Double backward through an op that saved its output (tanh: the second
    derivative goes through it): -2 tanh(x) (1 - tanh(x)^2)."""
    x = pf.tensor([-1.0, 0.3, 2.0], dtype=pf.float64, requires_grad=True)
    y = pf.tanh(x)
    saved = y.grad_fn.ctx.saved_tensors[0]
    assert saved.grad_fn is y.grad_fn and saved._version is y._version
    (g,) = pf.autograd.grad(y.sum(), [x], create_graph=True)
    (gg,) = pf.autograd.grad(g.sum(), [x])
    t = np.tanh(np.array([-1.0, 0.3, 2.0]))
    assert_close(g, 1 - t ** 2)
    assert_close(gg, -2 * t * (1 - t ** 2))
    z = pf.exp(x)
    with pf.no_grad():
        z.add_(1.0)                  # a saved output is still version-checked
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()


@pytest.mark.parametrize("shape", [(2, 3), (2, 5, 3)])
def test_double_backward_through_linear_reaches_its_input(shape):
    """The weight's gradient depends on the input: a double backward must follow
    it into x.  Linear used to save only its input's rows, made where nothing
    records, and the second gradient raised 'does not require grad'."""
    for path in (contextlib.nullcontext, general_path):
        with path():
            x = pf.ones(*shape, requires_grad=True)
            w = pf.ones(4, 3, requires_grad=True)
            y = pf.nn.functional.linear(x * 1.0, w)
            (gw,) = pf.autograd.grad(y.sum(), [w], create_graph=True)
            (gx,) = pf.autograd.grad(gw.sum(), [x])
        assert_close(gx, np.full(shape, 4.0))       # d/dx of sum(x rows) * 4 outputs


def test_a_graph_keeps_its_leaves_alive_and_each_leaf_has_one_accumulator():
    """A leaf keeps its AccumulateGrad node for its life (a recorded op makes no
    new one), the node refers to it weakly, and a graph keeps its leaves alive
    (a leaf dropped by the user still gets its gradient and hooks), with no
    reference cycle."""
    gc.disable()
    try:
        x = pf.ones(3, requires_grad=True)
        seen = []
        x.register_hook(lambda g: seen.append(g))
        y1, y2 = x * 2.0, x * 3.0
        acc = y1.grad_fn.next_functions[0][0]
        assert acc.name() == "AccumulateGrad" and acc.tensor is x
        assert y2.grad_fn.next_functions[0][0] is acc and y2.grad_fn.next_functions[0][1] == 0
        dead = weakref.ref(x)
        del x
        assert dead() is not None           # the graphs hold it
        y1.sum().backward()
        assert len(seen) == 1
        assert_close(dead().grad, [2.0, 2.0, 2.0])
        del y1, y2, acc
        assert dead() is None               # freed with its graphs, no collector needed
    finally:
        gc.enable()


@pytest.mark.parametrize("op", ["view", "reshape"])
def test_a_missing_shape_is_a_type_error_even_for_a_0d_tensor(op):
    """The fast path must not take ``x.reshape()`` for the 0-d shape (a 0-d
    tensor has one element, as the empty shape does): PyTorch's TypeError."""
    x = pf.tensor(3.0)
    with pytest.raises(TypeError, match=f"{op}\\(\\) missing 1 required positional argument"):
        getattr(x, op)()


# ------------------------------------------------------------------ more fast paths (GPT's ops)
@pytest.mark.parametrize("grad", ["none", "a", "b"])
def test_matmul_of_two_stacks_with_the_same_batch_dims(applied, grad):
    """Attention's per-head products: (b, h, n, k) @ (b, h, k, m), one of them a
    strided view (heads split out of a fused projection)."""
    a = _tensor((2, 3, 4, 5), requires_grad=grad == "a")
    qkv = _tensor((2, 4, 3, 6), seed=1)
    b = qkv.transpose(1, 2)[..., :2].mT.detach()   # (2, 3, 2, 4), strided: k along dim -1
    b.requires_grad_(grad == "b")
    assert not b.is_contiguous()
    out = _check(lambda b, a: pf.matmul(b, a), b, a, applied=applied)
    assert tuple(out.shape) == (2, 3, 2, 5)
    # batch dims that broadcast, or a stack @ a matrix (folded): the general path
    _check(pf.matmul, _tensor((1, 3, 4, 5)), _tensor((2, 3, 5, 2), seed=2), fast=False,
           applied=applied)
    _check(pf.matmul, _tensor((2, 3, 4, 5)), _tensor((5, 2), seed=2), fast=False, applied=applied)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        pf.matmul(_tensor((2, 3, 4, 5)), _tensor((2, 3, 4, 5)))


@pytest.mark.parametrize("grad", [False, True])
def test_view_and_reshape_of_a_strided_input(applied, grad):
    """q of a split qkv is strided; viewing its last dim as (heads, size) needs no
    copy, so view and reshape take the fast path and share storage; a layout no
    view can give raises view's error, and reshape copies (recorded as Clone +
    View when it records, one new array otherwise)."""
    qkv = _tensor((2, 3, 12))
    q = qkv[..., 4:8].detach().requires_grad_(grad)     # strided, a leaf
    assert not q.is_contiguous()
    for fn in (lambda x: x.view(2, 3, 2, 2), lambda x: x.reshape(6, 4),
               lambda x: x.view(-1, 4)):
        out = _check(fn, q, fast=True, applied=applied)
        assert out._base is q and out._version is q._version
        assert np.shares_memory(out.numpy(force=True), qkv.numpy())
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        q.view(24)
    out = _check(lambda x: x.reshape(24), q, fast=not grad, applied=applied)
    assert not np.shares_memory(out.numpy(force=True), qkv.numpy())
    if not grad:
        assert out._base is None and out._version is not q._version


def test_a_strided_gradient_through_a_view_is_copied_where_nothing_records():
    """The backward of ``x.view(...)`` reshapes a transposed gradient: a copy,
    made directly when nothing records the backward."""
    x = _tensor((4, 6), requires_grad=True)
    y = x.view(4, 2, 3).transpose(0, 2)            # (3, 2, 4)
    g = _tensor((3, 2, 4), seed=3)
    (gx,) = pf.autograd.grad(y, [x], g)
    np.testing.assert_array_equal(gx.numpy(), g.numpy().transpose(2, 1, 0).reshape(4, 6))


@pytest.mark.parametrize("grad", [False, True])
def test_contiguous_and_clone(applied, grad):
    x = _tensor((3, 4)).t().detach().requires_grad_(grad)     # strided, a leaf
    out = _check(lambda x: x.contiguous(), x, applied=applied)
    assert out.is_contiguous() and not np.shares_memory(out.numpy(force=True),
                                                        x.numpy(force=True))
    _check(pf.clone, x, applied=applied)


@pytest.mark.parametrize("affine", ["none", "weight", "both"])
@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("shape", [(6,), (2, 3, 6)])
def test_layer_norm(applied, affine, grad, shape):
    x = _tensor(shape, requires_grad=grad)
    w = None if affine == "none" else _tensor((6,), seed=1, requires_grad=grad)
    b = _tensor((6,), seed=2, requires_grad=grad) if affine == "both" else None
    for ns in (6, (6,), [6]):
        _check(lambda x: pf.nn.functional.layer_norm(x, ns, w, b), x, applied=applied)


def test_layer_norm_just_outside(applied):
    x = _tensor((2, 3, 6), requires_grad=True)
    w = _tensor((3, 6), seed=1, requires_grad=True)
    ln = pf.nn.functional.layer_norm
    _check(lambda x: ln(x, (3, 6), w), x, fast=False, applied=applied)     # two dims
    _check(lambda x: ln(x, 6, eps=np.float64(1e-3)), x, fast=False, applied=applied)
    _check(lambda x: ln(x, 6, w[0].to(pf.float64)), x, fast=False, applied=applied)
    with pytest.raises(RuntimeError, match="expected input with shape"):
        ln(x, 5)
    with pytest.raises(RuntimeError, match="expected weight of shape"):
        ln(x, 6, _tensor((5,)))
    with pytest.raises(RuntimeError, match="floating point"):
        ln(_tensor((2, 6), np.int64), 6)


@pytest.mark.parametrize("fn", [pf.softmax, pf.log_softmax])
@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("grad", [False, True])
def test_softmax_and_log_softmax(applied, fn, dim, grad):
    x = _tensor((3, 5), requires_grad=grad)
    _check(lambda x: fn(x, dim), x, applied=applied)


def test_softmax_just_outside(applied):
    x = _tensor((3, 5), requires_grad=True)
    _check(lambda x: pf.softmax(x, 1, dtype=pf.float64), x, fast=False, applied=applied)
    _check(lambda x: pf.softmax(x, np.int64(1)), x, fast=False, applied=applied)
    with pytest.raises(IndexError, match="out of range"):
        pf.softmax(x, 2)
    with pytest.raises(RuntimeError, match="floating point"):
        pf.softmax(_tensor((3,), np.int64), 0)


@pytest.mark.parametrize("value", [float("-inf"), 2.5, 3])
@pytest.mark.parametrize("grad", [False, True])
def test_masked_fill_and_where(applied, value, grad):
    x = _tensor((2, 3, 4), requires_grad=grad)
    mask = _tensor((1, 3, 4), bool, seed=4)
    _check(lambda x: x.masked_fill(mask, value), x, applied=applied)
    y = _tensor((3, 1), seed=5, requires_grad=grad)
    _check(lambda x, y: pf.where(mask, x, y), x, y, applied=applied)
    _check(lambda x: pf.where(mask, value, x), x, applied=applied)


def test_masked_fill_and_where_just_outside(applied):
    x = _tensor((2, 3), requires_grad=True)
    mask = _tensor((2, 3), bool, seed=4)
    _check(lambda x: x.masked_fill(mask, pf.tensor(1.5)), x, fast=False, applied=applied)
    _check(lambda x: pf.where(mask, x, x.to(pf.float64)), x, fast=False, applied=applied)
    i = _tensor((2, 3), np.int64)
    out = _check(lambda i: i.masked_fill(mask, 2.7), i, fast=False, applied=applied)
    assert out.dtype is pf.int64                        # truncated, as in PyTorch
    with pytest.raises(TypeError, match="mask must be a bool Tensor"):
        x.masked_fill(mask.to(pf.float32), 0.0)
    with pytest.raises(RuntimeError, match="not broadcastable"):
        x.masked_fill(_tensor((4,), bool), 0.0)
    with pytest.raises(TypeError, match="condition must be a bool Tensor"):
        pf.where(x, x, 0.0)


def test_softmax_output_saved_without_a_reference_cycle():
    gc.disable()
    try:
        x = _tensor((8, 8), requires_grad=True)
        for op in (lambda t: pf.softmax(t, -1), lambda t: pf.log_softmax(t, 0)):
            y = op(x)
            dead, node = weakref.ref(y), weakref.ref(y.grad_fn)
            del y
            assert dead() is None and node() is None
    finally:
        gc.enable()
