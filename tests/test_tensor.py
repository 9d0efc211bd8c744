"""The Tensor object itself: repr (PyTorch's exact format), metadata, data
access (item, tolist, numpy, len, iter, bool), version counters of views,
detach, requires_grad rules, conversions."""
import re

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import assert_close, needs_torch, torch


# ----------------------------------------------------------------- repr
def test_repr_examples():
    assert repr(pf.tensor([0.0, 2.5, 10.0])) == "tensor([ 0.0000,  2.5000, 10.0000])"
    assert repr(pf.tensor([1, 2])) == "tensor([1, 2])"
    assert repr(pf.tensor([1.0, 2.0])) == "tensor([1., 2.])"
    assert repr(pf.tensor(3.5)) == "tensor(3.5000)"
    assert repr(pf.tensor([True, False])) == "tensor([ True, False])"
    assert repr(pf.tensor([1.5], dtype=pf.float64)) == "tensor([1.5000], dtype=pyflow.float64)"
    assert repr(pf.tensor([1e-5, 1.0])) == "tensor([1.0000e-05, 1.0000e+00])"
    assert repr(pf.tensor([1, 2], dtype=pf.int32)) == "tensor([1, 2], dtype=pyflow.int32)"
    assert repr(pf.zeros(2, 0)) == "tensor([], size=(2, 0))"
    assert repr(pf.zeros(0, dtype=pf.int64)) == "tensor([], dtype=pyflow.int64)"
    assert repr(pf.tensor([float("nan"), 1.0, float("inf")])) == "tensor([nan, 1., inf])"
    x = pf.tensor([1.0, 2.0], requires_grad=True)
    assert repr(x) == "tensor([1., 2.], requires_grad=True)"
    assert re.fullmatch(r"tensor\(3\., grad_fn=<\w+Backward>\)", repr(x.sum()))
    assert repr(pf.tensor([[1.0, 2.0], [3.0, 4.0]])) == "tensor([[1., 2.],\n        [3., 4.]])"
    assert str(pf.tensor([1, 2])) == repr(pf.tensor([1, 2]))
    assert f"{pf.tensor(2.5):.2f}" == "2.50"


def _normalized(s):
    """Library name out, and the suffix line wrap (``dtype=pyflow.x`` is one
    character longer than ``dtype=torch.x``, which can move it to a new line)."""
    s = s.replace("pyflow.", "torch.")
    return re.sub(r",\s*\n\s*(dtype=|requires_grad=)", r", \1", s)


REPR_CASES = [
    np.array([0.0, 2.5, 10.0]), np.array([1, 2]), np.arange(2000.0).reshape(40, 50),
    np.array([1e-5, 1.0]), np.array([1e9, 1.0]), np.array([np.nan, np.inf, -np.inf, 1.5]),
    np.array([100000.0, 1.0]), np.array(1e-8), np.array(-0.0), np.zeros((0, 3)), np.zeros(0),
    np.array(3.5), np.array(True), np.arange(2000).reshape(2, 10, 100),
    np.array([[True, False]]), np.arange(-40, 40).reshape(4, 20) * 1.37,
    np.linspace(-1e3, 1e3, 31), np.array([0.0, 0.0]), np.array([[[1.25]]]),
]


@needs_torch
@pytest.mark.parametrize("i", range(len(REPR_CASES)))
@pytest.mark.parametrize("dtype", [None, "float64", "float16", "bfloat16", "int32"])
def test_repr_matches_torch(i, dtype):
    x = REPR_CASES[i]
    if dtype and x.dtype == bool or (dtype == "int32" and not np.all(np.isfinite(x))):
        return
    t = torch.tensor(x, dtype=getattr(torch, dtype) if dtype else None)
    p = pf.tensor(x, dtype=getattr(pf, dtype) if dtype else None)
    assert _normalized(repr(p)) == _normalized(repr(t))


@needs_torch
@given(shape=st.lists(st.integers(1, 5), max_size=3), scale=st.sampled_from([1e-6, 1.0, 1e3, 1e9]),
       seed=st.integers(0, 2**16), ints=st.booleans())
def test_repr_random_matches_torch(shape, scale, seed, ints):
    x = np.random.default_rng(seed).standard_normal(shape) * scale
    if ints:
        x = np.round(x)
    assert _normalized(repr(pf.tensor(x, dtype=pf.float32))) == \
        _normalized(repr(torch.tensor(x, dtype=torch.float32)))


@needs_torch
def test_repr_requires_grad_matches_torch():
    for lib in (pf, torch):
        x = lib.tensor([[0.5, 1.25], [3.0, 4.0]], requires_grad=True)
        if lib is pf:
            p = repr(x)
        else:
            t = repr(x)
    assert _normalized(p) == _normalized(t)


# ----------------------------------------------------------------- metadata
def test_metadata():
    t = pf.zeros(2, 3, 4)
    assert t.shape == (2, 3, 4) and t.size() == pf.Size([2, 3, 4]) and t.size(-1) == 4
    assert repr(t.shape) == "pyflow.Size([2, 3, 4])"
    assert t.ndim == t.dim() == 3 and t.numel() == 24 and t.shape.numel() == 24
    assert t.stride() == (12, 4, 1) and t.stride(0) == 12
    assert t.element_size() == 4 and pf.zeros(1, dtype=pf.bfloat16).element_size() == 2
    assert t.is_leaf and not t.requires_grad and t.is_floating_point()
    assert not pf.zeros(1, dtype=pf.int64).is_floating_point()
    assert t.device.type == "cpu" and not t.is_cuda
    assert t.type() == "pyflow.FloatTensor" and pf.tensor([1]).type() == "pyflow.LongTensor"
    with pytest.raises(IndexError, match="out of range"):
        t.size(3)
    with pytest.raises(TypeError, match="expected an int"):
        t.size(1.0)


def test_cannot_construct_directly():
    with pytest.raises(TypeError, match="pyflow.tensor"):
        pf.Tensor([1, 2])


# ----------------------------------------------------------------- data access
def test_item_tolist_numpy_len_iter_bool():
    t = pf.tensor([[1.5, 2.0], [3.0, 4.0]])
    assert t[0, 0].item() == 1.5 and isinstance(t[0, 0].item(), float)
    assert isinstance(pf.tensor([7]).item(), int) and pf.tensor([True]).item() is True
    assert t.tolist() == [[1.5, 2.0], [3.0, 4.0]]
    assert pf.tensor(2).tolist() == 2
    assert pf.tensor([1.5], dtype=pf.bfloat16).tolist() == [1.5]
    assert len(t) == 2 and [r.tolist() for r in t] == [[1.5, 2.0], [3.0, 4.0]]
    assert bool(pf.tensor([1.0])) and not bool(pf.tensor(0))
    assert float(pf.tensor(2)) == 2.0 and int(pf.tensor(2.7)) == 2
    assert [10, 20, 30][pf.tensor(1)] == 20                    # __index__
    n = t.cpu().numpy()
    n[0, 0] = 9.0                                               # shares memory
    assert t[0, 0].item() == 9.0
    with pytest.raises(RuntimeError, match="cannot be converted to Scalar"):
        t.item()
    with pytest.raises(RuntimeError, match="ambiguous"):
        bool(t)
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(pf.tensor(1.0))
    with pytest.raises(TypeError, match="iteration over a 0-d tensor"):
        iter(pf.tensor(1.0))
    with pytest.raises(RuntimeError, match="requires grad"):
        pf.ones(2, requires_grad=True).cpu().numpy()
    with pytest.raises(TypeError, match="bfloat16"):
        pf.ones(2, dtype=pf.bfloat16).cpu().numpy()
    with pytest.raises(TypeError, match="only integer tensors"):
        [1, 2][pf.tensor(1.0)]


def test_array_protocol():
    t = pf.tensor([1.0, 2.0], dtype=pf.bfloat16)
    assert np.asarray(t).dtype == np.float32
    assert_close(np.asarray(pf.tensor([1, 2]), dtype=np.float64), [1.0, 2.0])


# ----------------------------------------------------------------- versions, views, detach
def test_version_counter_is_shared_by_views_and_detach():
    base = pf.zeros(4)
    views = [base[1:], base.view(2, 2), base.detach(), base.data, base.unsqueeze(0)]
    base.add_(1.0)
    assert all(v._version[0] == 1 for v in views)
    views[0][0] = 5.0
    assert base._version[0] == 2 and base[1].item() == 5.0
    assert base.clone()._version is not base._version


def test_detach_and_requires_grad_rules():
    x = pf.tensor([1.0, 2.0], requires_grad=True)
    y = x * 2
    assert not y.is_leaf and y.requires_grad and y.grad_fn is not None
    d = y.detach()
    assert d.is_leaf and not d.requires_grad and d.grad_fn is None
    d[0] = 10.0                                    # same memory as y
    assert y[0].item() == 10.0
    with pytest.raises(RuntimeError, match="only Tensors of floating point dtype"):
        pf.tensor([1, 2]).requires_grad_()
    with pytest.raises(RuntimeError, match="non-leaf"):
        y.requires_grad_(False)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        x.add_(1.0)


# ----------------------------------------------------------------- conversions
@pytest.mark.parametrize("method, dtype", [("float", pf.float32), ("double", pf.float64),
                                           ("half", pf.float16), ("bfloat16", pf.bfloat16),
                                           ("int", pf.int32), ("long", pf.int64),
                                           ("bool", pf.bool)])
def test_conversion_methods(method, dtype):
    t = pf.tensor([0.0, 1.5, -2.75])
    out = getattr(t, method)()
    assert out.dtype is dtype
    ref = np.array([0.0, 1.5, -2.75])
    expect = {pf.int32: ref.astype(np.int32), pf.int64: ref.astype(np.int64),
              pf.bool: ref != 0}.get(dtype, ref)
    assert out.tolist() == expect.tolist()


def test_to_and_grad_through_cast():
    x = pf.tensor([1.0, 2.0], dtype=pf.float64, requires_grad=True)
    assert x.to(pf.float64) is x and x.to(dtype=pf.float64) is x
    assert x.to(pf.float64, copy=True) is not x
    y = x.to(pf.float32)
    assert y.dtype is pf.float32 and y.grad_fn is not None
    (y * 3).sum().backward()
    assert x.grad.dtype is pf.float64 and x.grad.tolist() == [3.0, 3.0]
    assert pf.tensor([1]).to(pf.tensor([1.0], dtype=pf.float16)).dtype is pf.float16
    assert x.cpu() is x
    with pytest.raises(TypeError, match="expected a dtype, a device or a Tensor"):
        x.to(3.5)


@pytest.mark.parametrize("name, dtype", [("float", pf.float32), ("double", pf.float64),
                                         ("half", pf.float16), ("int", pf.int32),
                                         ("long", pf.int64), ("bool", pf.bool),
                                         ("float32", pf.float32), ("bfloat16", pf.bfloat16),
                                         ("torch.float", pf.float32), ("pyflow.int64", pf.int64)])
def test_dtype_names_mean_what_torch_names_mean(name, dtype):
    """"float" is float32 and "int" int32, as torch.float and torch.int (NumPy's
    "float" is float64 and its "int" int64, which .to(dtype="float") used to give)."""
    x = pf.tensor([1.0, 2.0], dtype=pf.float64)
    assert x.to(dtype=name).dtype is dtype
    assert pf.zeros(2, dtype=name).dtype is dtype
    assert x.sum(dtype=name).dtype is dtype


def test_python_types_as_dtypes_and_unknown_names():
    assert pf.zeros(1, dtype=float).dtype is pf.float64        # torch: Python float is double
    assert pf.zeros(1, dtype=int).dtype is pf.int64
    assert pf.zeros(1, dtype=bool).dtype is pf.bool
    for bad in ("f4", "float_", "complex", "int8"):             # NumPy spellings are not names
        with pytest.raises(TypeError, match="unknown dtype name"):
            pf.ones(2).to(dtype=bad)
