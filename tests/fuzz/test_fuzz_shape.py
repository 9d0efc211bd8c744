"""Reductions with bad dims; reshape/view/permute/transpose/flatten/squeeze/
expand/narrow/select and cat/stack/split/chunk with bad arguments."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from .harness import FLOATS, NOT_TENSORS, arrays, check, fuzz

pytestmark = pytest.mark.cpu_only

dims = st.one_of(st.integers(-4, 4), st.none(), st.tuples(st.integers(-4, 4)),
                 st.tuples(st.integers(-3, 3), st.integers(-3, 3)))
REDUCTIONS = ["sum", "mean", "prod", "amax", "amin", "argmax", "max", "min", "logsumexp", "var",
              "std", "all", "any", "cumsum", "norm"]


FLOAT_ONLY = ("mean", "var", "std", "logsumexp", "norm")


@fuzz
@given(data=st.data(), dim=dims, keepdim=st.booleans(), op=st.sampled_from(REDUCTIONS))
def test_reductions(data, dim, keepdim, op):
    # one fault at a time: the float-only reductions see an int input only with a
    # valid dim (torch checks the dtype first, pyflow the dim)
    x = data.draw(arrays(max_dims=3))
    n = max(x.values.ndim, 1)
    dim_ok = all(-n <= d < n for d in (dim if isinstance(dim, tuple) else (dim,))
                 if d is not None)
    if op in FLOAT_ONLY and x.dtype not in FLOATS and not dim_ok:
        return
    if op in ("max", "min", "argmax", "prod", "cumsum") and isinstance(dim, tuple):
        return          # one dim only: a tuple is another overload (amax) in torch
    if isinstance(dim, tuple) and len({d % n for d in dim}) < len(dim) and x.values.size == 0:
        return          # two faults (a repeated dim, an empty input): checked in either order
    if op == "cumsum":
        check(lambda lib, T: getattr(lib, op)(T(x), dim))
    elif dim is None:
        check(lambda lib, T: getattr(lib, op)(T(x)))
    elif op == "norm":      # norm's second argument is p
        check(lambda lib, T: lib.norm(T(x), dim=dim, keepdim=keepdim))
    else:
        check(lambda lib, T: getattr(lib, op)(T(x), dim, keepdim=keepdim))


@fuzz
@given(x=arrays(max_dims=3, dtypes=("float32", "float64")), op=st.sampled_from(REDUCTIONS),
       dim=st.sampled_from(["1", 1.0, [0, "a"]]))
def test_reductions_dim_types(x, op, dim):
    # floating point input: a wrong dim type is then the only fault
    check(lambda lib, T: getattr(lib, op)(T(x), dim=dim))


sizes = st.lists(st.integers(-2, 6), max_size=4).map(tuple)


@fuzz
@given(x=arrays(max_dims=3, dtypes=("float32", "int64")), shape=sizes,
       op=st.sampled_from(["reshape", "view", "permute", "expand", "flatten", "squeeze",
                           "unsqueeze", "transpose", "movedim", "t", "narrow", "select",
                           "unflatten"]),
       a=st.integers(-4, 4), b=st.integers(-4, 4))
def test_views(x, shape, op, a, b):
    if op == "expand" and any(s < -1 for s in shape):
        return      # torch.expand returns negative sizes next to a 0 (a torch bug)
    n = x.values.ndim
    if op == "permute" and len(set(shape)) < len(shape) and any(not -n <= d < n for d in shape):
        return      # two faults (a repeated dim, one out of range): checked in either order
    if op in ("reshape", "view", "permute", "expand"):
        check(lambda lib, T: getattr(T(x), op)(*shape))
        check(lambda lib, T: getattr(T(x), op)(shape))
        if op in ("reshape", "permute"):        # torch has no function view or expand
            check(lambda lib, T: getattr(lib, op)(T(x), shape))
    elif op in ("flatten", "transpose", "movedim"):
        check(lambda lib, T: getattr(lib, op)(T(x), a, b))
    elif op in ("squeeze", "unsqueeze"):
        check(lambda lib, T: getattr(lib, op)(T(x), a))
    elif op == "t":
        check(lambda lib, T: lib.t(T(x)))
    elif op == "narrow":
        # one fault at a time: torch checks the length before the dim, pyflow after
        n = x.values.ndim
        if -n <= a < n or n == 0:
            check(lambda lib, T: lib.narrow(T(x), a, b, shape[0] if shape else 1))
    elif op == "select":
        check(lambda lib, T: lib.select(T(x), a, b))
    else:
        check(lambda lib, T: lib.unflatten(T(x), a, shape))


@fuzz
@given(op=st.sampled_from(["reshape", "flatten", "permute", "transpose", "squeeze", "split",
                           "narrow", "unbind", "movedim", "t"]),
       arg=NOT_TENSORS)
def test_views_wrong_type(op, arg):
    extra = {"reshape": ((1,),), "permute": ((0,),), "transpose": (0, 1), "split": (1,),
             "narrow": (0, 0, 1), "movedim": (0, 1)}.get(op, ())
    check(lambda lib, T: getattr(lib, op)(arg, *extra))


@fuzz
@given(data=st.data(), n=st.integers(1, 3), dim=st.integers(-4, 4),
       op=st.sampled_from(["cat", "stack", "hstack", "vstack"]),
       dts=st.lists(st.sampled_from(["float32", "float64", "int64", "bool"]), min_size=3,
                    max_size=3), wrong=st.one_of(st.none(), NOT_TENSORS))
def test_joins(data, n, dim, op, dts, wrong):
    # (an empty list is left out: torch.cat([]) raises ValueError and stack/hstack
    # RuntimeError; pyflow raises RuntimeError for all, tests/ops/test_join.py asserts it)
    base = data.draw(st.lists(st.integers(0, 3), max_size=3))
    xs = []
    for i in range(n):
        shape = list(base)
        if shape and data.draw(st.booleans()):
            shape[data.draw(st.integers(0, len(shape) - 1))] += 1
        if data.draw(st.integers(0, 5)) == 0:
            shape = shape[1:]
        xs.append(data.draw(arrays(shape=tuple(shape), dtype=dts[i])))
    if op in ("cat", "stack"):
        check(lambda lib, T: getattr(lib, op)([T(x) for x in xs], dim))
    else:
        check(lambda lib, T: getattr(lib, op)([T(x) for x in xs]))
    if wrong is not None:
        check(lambda lib, T: lib.cat([T(x) for x in xs] + [wrong]))
        check(lambda lib, T: lib.cat(wrong))


@fuzz
@given(x=arrays(max_dims=3, dtypes=("float32", "int64")), dim=st.integers(-4, 4),
       size=st.one_of(st.integers(-1, 4), st.lists(st.integers(-1, 4), max_size=4)),
       op=st.sampled_from(["split", "chunk", "unbind"]))
def test_splits(x, dim, size, op):
    if op == "unbind":
        check(lambda lib, T: lib.unbind(T(x), dim))
    elif op == "chunk":
        if isinstance(size, int):
            check(lambda lib, T: lib.chunk(T(x), size, dim))
    else:
        check(lambda lib, T: lib.split(T(x), size, dim))
