"""Matrix products (matmul, mm, bmm, linear) with shape and dtype mismatches, and
conv2d/pooling with bad shapes and bad stride, padding, dilation, groups."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from .harness import FLOATS, NOT_TENSORS, arrays, check, fuzz

pytestmark = pytest.mark.cpu_only

# One dtype per case: pyflow promotes mixed dtypes in products (ops/linalg.py's
# documented rule; torch raises "expected m1 and m2 to have the same dtype").
MATMUL_DTYPES = ("float32", "float64", "int64", "bool")


@fuzz
@given(op=st.sampled_from(["matmul", "mm", "bmm", "mv", "dot"]), data=st.data(),
       dtype=st.sampled_from(MATMUL_DTYPES))
def test_products(op, data, dtype):
    # (mv of a 0-d input: torch's IndexError is an accident of its size(0) call)
    a = data.draw(arrays(dtype=dtype, min_dims=int(op == "mv"), max_dims=4, max_side=3))
    b = data.draw(arrays(dtype=dtype, max_dims=4, max_side=3))
    if dtype == "bool" and (a.values.size == 0 or b.values.size == 0):
        return      # torch returns an empty bool product without reaching its bool check
    check(lambda lib, T: getattr(lib, op)(T(a), T(b)))


@fuzz
@given(data=st.data(), dtype=st.sampled_from(MATMUL_DTYPES),
       bias=st.sampled_from(["none", "ok", "any"]), wrong=st.one_of(st.none(), NOT_TENSORS))
def test_linear(data, dtype, bias, wrong):
    x = data.draw(arrays(dtype=dtype, max_dims=3, max_side=3))
    w = data.draw(arrays(dtype=dtype, max_dims=3, max_side=3))
    b = None if bias == "none" else data.draw(arrays(
        dtype=dtype, shape=(w.values.shape[:1] if bias == "ok" else None), max_dims=2,
        max_side=3))
    if dtype == "bool" and (x.values.size == 0 or w.values.size == 0):
        return      # torch returns an empty bool product without reaching its bool check
    if w.values.ndim == 1 and b is not None and x.values.ndim > 1:
        return      # torch's addmm path refuses a bias with a 1-D weight; pyflow adds it
    check(lambda lib, T: lib.nn.functional.linear(T(x), T(w), T(b)))
    if wrong is not None:
        check(lambda lib, T: lib.nn.functional.linear(wrong, T(w)))
        check(lambda lib, T: lib.nn.functional.linear(T(x), wrong))


ints = st.one_of(st.integers(-1, 3), st.tuples(st.integers(-1, 3), st.integers(-1, 3)))
# Floating point only: pyflow's conv and pooling kernels are (documented); torch
# also takes int64.  Inputs have channels: torch convolves 0 input channels (and
# max-pools none), pyflow refuses both.
planes = dict(min_dims=2, max_dims=5, max_side=5)


def _no_empty_channels(x):
    return x.values.ndim < 3 or x.values.shape[-3] > 0


@fuzz
@given(data=st.data(), dtype=st.sampled_from(FLOATS[2:]),
       stride=ints, padding=st.one_of(ints, st.sampled_from(["same", "valid", "full"])),
       dilation=ints, groups=st.integers(-1, 3), bias=st.booleans())
def test_conv2d(data, dtype, stride, padding, dilation, groups, bias):
    x = data.draw(arrays(dtype=dtype, **planes).filter(_no_empty_channels))
    w = data.draw(arrays(dtype=dtype, min_dims=3, max_dims=5, max_side=3))
    b = data.draw(arrays(dtype=dtype, shape=w.values.shape[:1])) if bias and w.values.ndim \
        else None
    check(lambda lib, T: lib.nn.functional.conv2d(T(x), T(w), T(b), stride, padding, dilation,
                                                  groups))


@fuzz
@given(data=st.data(), op=st.sampled_from(["max_pool2d", "avg_pool2d"]),
       dtype=st.sampled_from(FLOATS[2:]),
       kernel=ints, stride=st.one_of(st.none(), ints), padding=ints, dilation=ints,
       ceil_mode=st.booleans())
def test_pool2d(data, op, dtype, kernel, stride, padding, dilation, ceil_mode):
    # (avg_pool2d of a 2-D input: torch's IndexError comes from its size(-3) call)
    x = data.draw(arrays(dtype=dtype, min_dims=2 + (op == "avg_pool2d"), max_dims=5,
                         max_side=5).filter(_no_empty_channels))
    if op == "max_pool2d":
        check(lambda lib, T: lib.nn.functional.max_pool2d(T(x), kernel, stride, padding,
                                                          dilation, ceil_mode))
    else:
        check(lambda lib, T: lib.nn.functional.avg_pool2d(T(x), kernel, stride, padding,
                                                          ceil_mode))


# Inputs of 3 or 4 dims: for fewer, torch's errors are accidents of its Python
# wrapper (a ValueError), or its output-size-1 shortcut (a mean, any rank).
# output_size 0 is kept out: torch returns an empty map, pyflow refuses it
# (tests/ops/test_conv.py::test_pool_errors asserts that).
@fuzz
@given(x=arrays(dtypes=("float32", "float64"), min_dims=3, max_dims=4, max_side=5),
       size=st.one_of(st.integers(-1, 4), st.none(),
                      st.tuples(st.one_of(st.none(), st.integers(-1, 4)), st.integers(-1, 4))
                      ).filter(lambda s: s != 0 and (not isinstance(s, tuple) or 0 not in s)))
def test_adaptive_avg_pool2d(x, size):
    if size == 1 and 0 in x.values.shape[-2:]:
        return      # torch's output-size-1 shortcut takes the mean of an empty plane
    check(lambda lib, T: lib.nn.functional.adaptive_avg_pool2d(T(x), size))
