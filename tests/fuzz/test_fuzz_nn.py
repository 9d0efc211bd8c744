"""softmax dims, losses with bad targets, normalization shapes, dropout p,
attention shapes, and modules (Linear, Conv2d, ...) called with wrong types."""
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from .harness import NOT_TENSORS, Arr, arrays, check, fuzz, values

pytestmark = pytest.mark.cpu_only


@fuzz
@given(x=arrays(max_dims=3, min_side=1), dim=st.one_of(st.integers(-4, 4), st.none()),
       op=st.sampled_from(["softmax", "log_softmax"]),
       dtype=st.sampled_from([None, "float32", "float64", "int64"]))
def test_softmax(x, dim, op, dtype):
    if dim is None:     # torch warns and picks a dim; pyflow's op wants one (F's picks)
        check(lambda lib, T: getattr(lib.nn.functional, op)(T(x), dim))
        return
    check(lambda lib, T: getattr(lib, op)(T(x), dim,
                                          dtype=None if dtype is None else getattr(lib, dtype)))


reductions = st.sampled_from(["mean", "sum", "none", "avg"])


# Deliberate differences kept out: class-index targets are int64 (pyflow also takes
# int32, torch does not; a float or bool one is pyflow's TypeError, torch's
# RuntimeError, tests/ops/test_loss.py asserts it); label_smoothing is in [0, 1]
# (pyflow's ValueError outside it is asserted there too, torch raises RuntimeError
# above 1 and takes a negative one); the weight has the input's dtype (pyflow
# promotes).
@fuzz
@given(data=st.data(), reduction=reductions, ignore_index=st.sampled_from([-100, 0, 1, 5, -1]),
       label_smoothing=st.sampled_from([0.0, 0.1, 1.0]), weighted=st.booleans(),
       op=st.sampled_from(["cross_entropy", "nll_loss"]))
def test_class_losses(data, reduction, ignore_index, label_smoothing, weighted, op):
    x = data.draw(arrays(min_dims=1, max_dims=3, min_side=1, max_side=4,
                         dtypes=("float32", "float64")))
    C = x.values.shape[1] if x.values.ndim > 1 else x.values.shape[0]
    tshape = data.draw(st.sampled_from(["ok", "ok", "probs", "any"]))
    if tshape == "probs" and op == "cross_entropy":    # class probabilities
        shape = x.values.shape if data.draw(st.booleans()) else None
        t = data.draw(arrays(shape=shape, dtype=x.dtype, max_dims=3, min_side=1))
    else:
        shape = None if tshape == "any" else \
            (x.values.shape[:1] + x.values.shape[2:] if x.values.ndim > 1 else ())
        t = data.draw(arrays(shape=shape, dtype="int64", max_dims=3, min_side=1))
        t.values = data.draw(values(t.values.shape, "int64", low=-2, high=C + 1))
    w = data.draw(arrays(shape=(data.draw(st.sampled_from([C, C, C + 1])),), dtype=x.dtype,
                         special=False)) if weighted else None
    if op == "cross_entropy":
        check(lambda lib, T: lib.nn.functional.cross_entropy(
            T(x), T(t), T(w), ignore_index=ignore_index, reduction=reduction,
            label_smoothing=label_smoothing))
    else:
        check(lambda lib, T: lib.nn.functional.nll_loss(T(x), T(t), T(w),
                                                        ignore_index=ignore_index,
                                                        reduction=reduction))


@fuzz
@given(data=st.data(), reduction=reductions,
       op=st.sampled_from(["mse_loss", "l1_loss", "binary_cross_entropy_with_logits"]),
       wrong=st.one_of(st.none(), NOT_TENSORS))
def test_pointwise_losses(data, reduction, op, wrong):
    dts = ("float32", "float64", "int64")
    x = data.draw(arrays(max_dims=3, min_side=1, dtypes=dts))
    t = data.draw(arrays(shape=x.values.shape if data.draw(st.booleans()) else None, max_dims=3,
                         min_side=1, dtypes=dts))
    if reduction == "avg" and t.values.shape != x.values.shape:
        return      # one fault at a time
    if op == "binary_cross_entropy_with_logits" and x.dtype != t.dtype:
        return      # torch's mixed-dtype result type varies here; pyflow promotes
    fn = lambda lib: getattr(lib.nn.functional, op)  # noqa: E731
    check(lambda lib, T: fn(lib)(T(x), T(t), reduction=reduction))
    if wrong is not None:
        check(lambda lib, T: fn(lib)(T(x), wrong))


# normalized_shape is a tuple (pyflow also takes an int, as nn.LayerNorm does; torch's
# F.layer_norm raises TypeError) and weights have the input's dtype (pyflow promotes).
@fuzz
@given(data=st.data(), eps=st.sampled_from([1e-5, 0.0, -1.0]), affine=st.booleans())
def test_layer_norm(data, eps, affine):
    x = data.draw(arrays(max_dims=3, min_side=1, dtypes=("float32", "float64", "int64")))
    shape = data.draw(st.one_of(st.just(x.values.shape[-1:]), st.just(x.values.shape[-2:]),
                                st.lists(st.integers(0, 3), max_size=2).map(tuple)))
    wshape = shape + (1,) if affine and data.draw(st.booleans()) else shape
    w = data.draw(arrays(shape=wshape, dtype="float32" if x.dtype == "int64" else x.dtype)) \
        if affine else None
    if x.dtype == "int64" and (w is not None or tuple(x.values.shape[-len(shape):]) != shape
                               or not shape):
        return      # one fault at a time: an int input with otherwise valid arguments
    check(lambda lib, T: lib.nn.functional.layer_norm(T(x), shape, T(w), None, eps))


# Inputs of 2 dims or more (for fewer, pyflow's ValueError is asserted by
# tests/ops/test_normalization.py; torch raises IndexError or RuntimeError depending
# on the other arguments), floating point, with weights and statistics of the
# input's dtype (torch: "mixed dtype" RuntimeError, pyflow promotes).
@fuzz
@given(data=st.data(), training=st.booleans(), momentum=st.sampled_from([0.1, 0.0, 1.0]))
def test_batch_norm(data, training, momentum):
    x = data.draw(arrays(min_dims=2, max_dims=4, min_side=1, dtypes=("float32", "float64")))
    C = x.values.shape[1]
    C = data.draw(st.sampled_from([C, C, C + 1]))
    stats = data.draw(st.booleans())
    rm = Arr(np.zeros(C), x.dtype) if stats else None
    rv = Arr(np.ones(C), x.dtype) if stats else None
    w = data.draw(arrays(shape=(data.draw(st.sampled_from([C, C + 1])),), dtype=x.dtype,
                         special=False))
    per_channel = x.values.size // x.values.shape[1]
    if (training or not stats) and per_channel == 1 and (w.values.shape != (x.values.shape[1],) or
                                          C != x.values.shape[1]):
        return      # two faults (one value per channel, a size mismatch): either order
    check(lambda lib, T: lib.nn.functional.batch_norm(T(x), T(rm), T(rv), T(w), None,
                                                      training or not stats, momentum))


@fuzz
@given(x=arrays(max_dims=2, dtypes=("float32", "int64", "bool")),
       p=st.one_of(st.floats(-1, 2), st.sampled_from([0.0, 1.0, float("nan")]), NOT_TENSORS),
       training=st.booleans())
def test_dropout(x, p, training):
    if isinstance(p, float) and np.isnan(p):
        return      # torch: F.dropout's RuntimeError, nn.Dropout accepts; pyflow: ValueError
    if x.dtype != "float32" and training and p == 1:
        return      # torch zeroes an int/bool tensor for p=1 (and refuses p<1); pyflow refuses

    def case(lib, T):
        out = lib.nn.functional.dropout(T(x), p, training)
        # the kept elements are random: compare what is not (shape, dtype, zeros for p=1)
        return (tuple(out.shape), str(out.dtype).split(".")[-1],
                bool((out == 0).all()) if p == 1 and training else None)
    check(case)
    check(lambda lib, T: lib.nn.Dropout(p).p)


@fuzz
@given(data=st.data(), causal=st.booleans(), mask=st.sampled_from([None, "bool", "float"]))
def test_attention(data, causal, mask):
    # one dtype (torch refuses mixed ones, pyflow promotes) and no empty sides (torch
    # returns empty results before most of its checks)
    dt = data.draw(st.sampled_from(["float32", "float64"]))
    kw = dict(min_dims=1, max_dims=4, min_side=1, max_side=3, dtype=dt, special=False)
    q = data.draw(arrays(**kw))
    k = data.draw(arrays(shape=q.values.shape if data.draw(st.booleans()) else None, **kw))
    v = data.draw(arrays(shape=k.values.shape if data.draw(st.booleans()) else None, **kw))
    m = None if mask is None else data.draw(arrays(
        min_dims=2, max_dims=3, min_side=1, max_side=3, dtype="bool" if mask == "bool" else dt,
        special=False))
    check(lambda lib, T: lib.nn.functional.scaled_dot_product_attention(
        T(q), T(k), T(v), T(m), is_causal=causal))


MODULES = [("Linear", (3, 2)), ("Conv2d", (1, 2, 1)), ("BatchNorm1d", (3,)),
           ("BatchNorm2d", (3,)), ("LayerNorm", (3,)), ("ReLU", ()), ("GELU", ()),
           ("Softmax", (0,)), ("LogSoftmax", (-1,)), ("Dropout", ()), ("Flatten", ()),
           ("Unflatten", (0, (1, -1))), ("Embedding", (4, 2)), ("MaxPool2d", (2,)),
           ("AvgPool2d", (2,)), ("AdaptiveAvgPool2d", (2,)), ("Tanh", ()), ("Sigmoid", ()),
           ("SiLU", ())]
LOSSES = ["MSELoss", "L1Loss", "CrossEntropyLoss", "NLLLoss", "BCEWithLogitsLoss"]


@fuzz
@given(module=st.sampled_from(MODULES), arg=NOT_TENSORS, train=st.booleans())
def test_modules_wrong_type(module, arg, train):
    name, args = module

    def case(lib, T):
        m = getattr(lib.nn, name)(*args)
        return m.train(train)(arg)
    check(case)


@fuzz
@given(loss=st.sampled_from(LOSSES), arg=NOT_TENSORS, first=st.booleans())
def test_losses_wrong_type(loss, arg, first):
    x = Arr(np.zeros((2, 3)), "float32")
    check(lambda lib, T: getattr(lib.nn, loss)()(arg, T(x)) if first else
          getattr(lib.nn, loss)()(T(x), arg))


@fuzz
@given(data=st.data(), module=st.sampled_from(MODULES))
def test_modules_bad_shapes(data, module):
    name, args = module
    # float32 input (int64 for Embedding): pyflow's conv/pool kernels are floating
    # point only and Linear promotes an int input (torch: a dtype mismatch error)
    x = data.draw(arrays(max_dims=4, min_side=1, max_side=3,
                         dtype="int64" if name == "Embedding" else "float32"))
    if name == "AvgPool2d" and x.values.ndim < 3:
        return      # torch's IndexError is an accident of its size(-3) call
    if name.startswith("BatchNorm") and x.values.ndim > 1 and x.values.shape[1] != args[0]:
        return      # pyflow's ValueError (as torch's module docs), asserted by
        #             tests/nn/test_nn_layers.py; torch's forward raises RuntimeError

    def case(lib, T):
        out = getattr(lib.nn, name)(*args)(T(x))
        # random weights (Linear, Conv2d, Embedding) or mask (Dropout): compare the shape
        random = name in ("Linear", "Conv2d", "Embedding", "Dropout")
        return (tuple(out.shape), str(out.dtype).split(".")[-1]) if random else out
    check(case)
