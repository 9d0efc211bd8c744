"""Creation ops, seeding, dtype conversion rules (bfloat16 rounding, float16
round trip) and the type-promotion table against torch.result_type."""
import itertools

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from tests.helpers import assert_close, needs_torch, torch

DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "bool"]


# ----------------------------------------------------------------- tensor / from_numpy
def test_tensor_infers_dtypes_like_torch():
    assert pf.tensor([1, 2]).dtype is pf.int64
    assert pf.tensor([1, 2.5]).dtype is pf.float32
    assert pf.tensor([True, False]).dtype is pf.bool
    assert pf.tensor([True, 2]).dtype is pf.int64
    assert pf.tensor(3.0).shape == () and pf.tensor([]).shape == (0,)
    assert pf.tensor(np.zeros(2, np.float64)).dtype is pf.float64
    assert pf.tensor(np.zeros(2, np.int32)).dtype is pf.int32
    assert pf.tensor([[1, 2], [3, 4]], dtype=pf.float64).tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert pf.tensor([pf.tensor(1.0), pf.tensor(2.0)]).tolist() == [1.0, 2.0]
    t = pf.tensor([1.0, 2.0], requires_grad=True)
    assert t.requires_grad and t.is_leaf


def test_tensor_copies_and_from_numpy_shares():
    a = np.array([1.0, 2.0, 3.0])
    t = pf.tensor(a)
    s = pf.from_numpy(a)
    a[0] = 100.0
    assert t[0].item() == 1.0 and s[0].item() == 100.0
    s[1] = -1.0
    assert a[1] == -1.0
    assert s.dtype is pf.float64
    assert pf.as_tensor(a)[0].item() == 100.0          # as_tensor shares too
    assert pf.as_tensor(s) is s


def test_tensor_errors():
    with pytest.raises(ValueError, match="rectangular"):
        pf.tensor([[1, 2], [3]])
    with pytest.raises(TypeError, match="could not infer a dtype"):
        pf.tensor("abc")
    with pytest.raises(TypeError, match="expected np.ndarray"):
        pf.from_numpy([1, 2])
    with pytest.raises(TypeError, match="no pyflow equivalent"):
        pf.from_numpy(np.zeros(2, np.complex64))
    with pytest.raises(TypeError, match="expected a pyflow dtype"):
        pf.zeros(2, dtype="complex")


# ----------------------------------------------------------------- filled tensors
@given(shape=st.lists(st.integers(0, 4), max_size=3).map(tuple),
       dtype=st.sampled_from([pf.float32, pf.float64, pf.int64, pf.int32, pf.bool, pf.float16]))
def test_filled(shape, dtype):
    for fn, val in ((pf.zeros, 0), (pf.ones, 1)):
        t = fn(*shape, dtype=dtype)
        assert t.shape == shape and t.dtype is dtype
        assert np.all(np.asarray(t) == val)
        assert fn(shape, dtype=dtype).shape == shape
    f = pf.full(shape, 7, dtype=dtype)
    assert f.shape == shape and np.all(np.asarray(f) == (True if dtype is pf.bool else 7))
    assert pf.empty(*shape, dtype=dtype).shape == shape
    base = pf.zeros(*shape, dtype=dtype)
    for like in (pf.zeros_like(base), pf.ones_like(base), pf.empty_like(base),
                 pf.full_like(base, 1)):
        assert like.shape == shape and like.dtype is dtype


def test_full_infers_dtype_and_like_overrides():
    assert pf.full((2,), 3).dtype is pf.int64
    assert pf.full((2,), 3.0).dtype is pf.float32
    assert pf.full((2,), True).dtype is pf.bool
    assert pf.zeros_like(pf.ones(2), dtype=pf.int32).dtype is pf.int32
    assert pf.ones(2, requires_grad=True).requires_grad
    with pytest.raises(RuntimeError, match="negative dimension"):
        pf.zeros(2, -1)
    with pytest.raises(TypeError, match="sequence of ints"):
        pf.ones(2.5)


@needs_torch
@pytest.mark.parametrize("args", [(5,), (1, 4), (0, 1, 0.25), (2.0, -1, -0.5), (-3, 3, 2),
                                  (0, 0.9, 0.3)])
def test_arange_matches_torch(args):
    p, t = pf.arange(*args), torch.arange(*args)
    assert p.dtype.name == str(t.dtype).split(".")[1]
    assert_close(p, t.cpu().numpy(), rtol=1e-7)


@needs_torch
@pytest.mark.parametrize("args", [(0, 1, 5), (-2.0, 3.0, 1), (1, 1, 0), (3, -3, 7)])
def test_linspace_eye_match_torch(args):
    assert_close(pf.linspace(*args), torch.linspace(*args).cpu().numpy(), rtol=1e-6, atol=1e-7)
    assert_close(pf.eye(3), torch.eye(3).cpu().numpy())
    assert_close(pf.eye(2, 4, dtype=pf.float64), torch.eye(2, 4, dtype=torch.float64).cpu().numpy())


def test_arange_errors():
    with pytest.raises(RuntimeError, match="step must be nonzero"):
        pf.arange(0, 3, 0)
    with pytest.raises(RuntimeError, match="steps must be a non-negative int"):
        pf.linspace(0, 1, -1)


# ----------------------------------------------------------------- random
def test_random_shapes_dtypes_and_ranges():
    r = pf.rand(2000)
    assert r.dtype is pf.float32 and 0.0 <= r.min().item() and r.max().item() < 1.0
    assert abs(r.mean().item() - 0.5) < 0.05
    n = pf.randn(4000, dtype=pf.float64)
    assert abs(n.mean().item()) < 0.1 and abs(n.std().item() - 1.0) < 0.1
    i = pf.randint(3, 7, (500,))
    assert i.dtype is pf.int64 and set(i.tolist()) == {3, 4, 5, 6}
    assert pf.randint(5, (2, 2)).shape == (2, 2)
    p = pf.randperm(10)
    assert p.dtype is pf.int64 and sorted(p.tolist()) == list(range(10))
    base = pf.zeros(2, 3, dtype=pf.float64)
    assert pf.rand_like(base).dtype is pf.float64 and pf.randn_like(base).shape == (2, 3)
    assert pf.randint_like(base, 4).shape == (2, 3)
    with pytest.raises(TypeError, match="floating point"):
        pf.rand(2, dtype=pf.int64)
    with pytest.raises(RuntimeError, match="expected low < high"):
        pf.randint(3, 3, (2,))


def test_manual_seed_and_generator_reproducibility():
    pf.manual_seed(123)
    a = (pf.rand(5), pf.randn(3), pf.randint(0, 100, (4,)), pf.randperm(6))
    pf.manual_seed(123)
    b = (pf.rand(5), pf.randn(3), pf.randint(0, 100, (4,)), pf.randperm(6))
    assert all(x.tolist() == y.tolist() for x, y in zip(a, b))
    g1, g2 = pf.Generator().manual_seed(7), pf.Generator().manual_seed(7)
    assert pf.rand(4, generator=g1).tolist() == pf.rand(4, generator=g2).tolist()
    assert pf.rand(4, generator=g1).tolist() != pf.rand(4, generator=pf.Generator().manual_seed(8)).tolist()
    with pytest.raises(TypeError, match="seed must be an int"):
        pf.manual_seed(1.5)
    with pytest.raises(TypeError, match="pyflow.Generator"):
        pf.rand(2, generator=3)


def test_rng_state_round_trip():
    state = pf.get_rng_state()
    x = pf.randn(3)
    pf.set_rng_state(state)
    assert pf.randn(3).tolist() == x.tolist()
    g = pf.Generator().manual_seed(7)
    pf.rand(5, generator=g)  # advance, mid-buffer states included
    s = g.get_state()
    a = pf.randn(4, generator=g)
    assert pf.randn(4, generator=g.set_state(s)).tolist() == a.tolist()
    with pytest.raises(ValueError, match="get_state"):
        g.set_state(pf.tensor([1, 2, 3]))


# ----------------------------------------------------------------- dtype conversions
def _bf16_rne(x32):
    """Reference bfloat16 rounding (round to nearest, ties to even) in float64 math."""
    bits = np.asarray(x32, np.float32).view(np.uint32).astype(np.uint64)
    lsb = (bits >> 16) & 1
    rounded = ((bits + 0x7FFF + lsb) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def test_bfloat16_rounds_to_nearest_even():
    one = np.float32(1.0)
    ulp = np.float32(2.0 ** -7)                        # bf16 spacing at 1.0
    halfway = np.float32(1.0 + 2.0 ** -8)               # tie -> even (1.0)
    odd_tie = np.float32(1.0 + 3 * 2.0 ** -8)           # tie -> even (1 + 2 ulp)
    above = np.nextafter(halfway, np.float32(2))        # just above the tie -> up
    vals = np.array([one, halfway, odd_tie, above, -halfway, 3.0e38, 1e-40, 0.0], np.float32)
    out = pf.tensor(vals, dtype=pf.bfloat16).float().cpu().numpy()
    np.testing.assert_array_equal(out, _bf16_rne(vals))
    assert out[1] == 1.0 and out[2] == 1.0 + 2 * ulp and out[3] == 1.0 + ulp
    assert np.isnan(pf.tensor([np.nan], dtype=pf.bfloat16).float().cpu().numpy()[0])
    if torch is not None:
        ref = torch.tensor(vals).to(torch.bfloat16).float().cpu().numpy()
        np.testing.assert_array_equal(out, ref)


@given(st.lists(st.floats(-1e4, 1e4, width=32), min_size=1, max_size=20))
def test_bfloat16_matches_reference(vals):
    v = np.array(vals, np.float32)
    np.testing.assert_array_equal(pf.tensor(v).bfloat16().float().cpu().numpy(), _bf16_rne(v))


def test_float16_round_trip():
    v = np.array([0.1, 1.0 / 3, 65504.0, 6e-8, -2.5, 70000.0], np.float32)
    h = pf.tensor(v).half()
    assert h.dtype is pf.float16 and h.cpu().numpy().dtype == np.float16
    np.testing.assert_array_equal(h.float().cpu().numpy(), v.astype(np.float16).astype(np.float32))
    exact = pf.tensor([0.5, -2.0, 1024.0], dtype=pf.float16)
    assert exact.float().half().tolist() == [0.5, -2.0, 1024.0]


@pytest.mark.parametrize("src, dst", list(itertools.product(DTYPES, DTYPES)))
def test_to_every_dtype_pair_matches_numpy(src, dst):
    vals = np.array([0.0, 1.0, -2.0, 3.0])
    t = pf.tensor(vals, dtype=getattr(pf, src))
    out = t.to(getattr(pf, dst))
    assert out.dtype is getattr(pf, dst)
    ref = pf.tensor(vals, dtype=getattr(pf, src)).float().cpu().numpy()
    expect = ref.astype(bool) if dst == "bool" else ref
    if src == "bool":
        expect = (vals != 0).astype(np.float32) if dst != "bool" else vals != 0
    np.testing.assert_array_equal(np.asarray(out.float()) if dst != "bool" else np.asarray(out),
                                  expect)


# ----------------------------------------------------------------- promotion vs torch
def _make(lib, name, dim):
    return lib.ones(2, dtype=getattr(lib, name)) if dim else lib.ones((), dtype=getattr(lib, name))


@needs_torch
@pytest.mark.parametrize("a, b", list(itertools.product(DTYPES, DTYPES)))
def test_result_type_matches_torch(a, b):
    assert pf.promote_types(getattr(pf, a), getattr(pf, b)).name == \
        str(torch.promote_types(getattr(torch, a), getattr(torch, b))).split(".")[1]
    for da, db in itertools.product((0, 1), (0, 1)):
        got = pf.result_type(_make(pf, a, da), _make(pf, b, db)).name
        want = str(torch.result_type(_make(torch, a, da), _make(torch, b, db))).split(".")[1]
        assert got == want, (a, da, b, db)


@needs_torch
@pytest.mark.parametrize("a", DTYPES)
@pytest.mark.parametrize("scalar", [True, 2, 2.5])
def test_result_type_with_scalars_matches_torch(a, scalar):
    for dim in (0, 1):
        got = pf.result_type(_make(pf, a, dim), scalar).name
        want = str(torch.result_type(_make(torch, a, dim), scalar)).split(".")[1]
        assert got == want
    assert (pf.ones(2, dtype=getattr(pf, a)) + scalar).dtype.name == \
        str((torch.ones(2, dtype=getattr(torch, a)) + scalar).dtype).split(".")[1]


def test_numpy_scalars_keep_their_dtype_like_torch():
    for value, expected in ((np.float64(1.5), pf.float64), (np.float32(1.5), pf.float32),
                            (np.int32(3), pf.int32), (np.bool_(True), pf.bool),
                            ([np.float64(1.0), 2.0], pf.float64), (1.5, pf.float32)):
        assert pf.tensor(value).dtype is expected, (value, pf.tensor(value).dtype)


# ----------------------------------------------------------------- numbers that do not fit
@pytest.mark.parametrize("make", [
    lambda v, dt: pf.tensor([v], dtype=dt),
    lambda v, dt: pf.tensor(v, dtype=dt),
    lambda v, dt: pf.tensor([1, v], dtype=dt),
    lambda v, dt: pf.full((2,), v, dtype=dt),
    lambda v, dt: pf.full_like(pf.zeros(2, dtype=dt), v),
    lambda v, dt: pf.zeros(2, dtype=dt).masked_fill(pf.tensor([True, False]), v),
    lambda v, dt: pf.zeros(2, dtype=dt).__setitem__(0, v),
    lambda v, dt: pf.zeros(2, dtype=dt).__setitem__(pf.tensor([True, False]), v),
], ids=["tensor list", "tensor scalar", "tensor mixed", "full", "full_like", "masked_fill",
        "setitem", "setitem mask"])
@pytest.mark.parametrize("value, dtype", [
    (2**40, "int32"), (2**31, "int32"), (-2**31 - 1, "int32"), (3e9, "int32"),
    (2147483647.5, "int32"), (2**63, "int64"), (-2**63 - 1, "int64"), (2**64, "int64"),
    (float("nan"), "int64"), (float("nan"), "int32"), (float("inf"), "int64"),
    (-float("inf"), "int64"), (1e30, "int64"), (2.0**63, "int64")])
def test_python_numbers_that_do_not_fit_an_integer_dtype_raise(make, value, dtype):
    """PyTorch raises "value cannot be converted to type int32 without overflow"; NumPy
    wrapped them silently (2**40 -> 0, NaN -> INT64_MIN)."""
    with pytest.raises(RuntimeError, match=f"cannot be converted to type {dtype} without overflow"):
        make(value, getattr(pf, dtype))


def test_numbers_at_the_edges_fit_and_conversions_of_tensors_wrap_like_torch():
    assert pf.tensor([-2**31, 2**31 - 1], dtype=pf.int32).tolist() == [-2**31, 2**31 - 1]
    assert pf.tensor([-2**63, 2**63 - 1]).tolist() == [-2**63, 2**63 - 1]
    assert pf.tensor([2.7, -2.7], dtype=pf.int64).tolist() == [2, -2]       # truncated
    assert pf.full((1,), 2.5, dtype=pf.int64).tolist() == [2]
    assert pf.tensor([2, 0, float("nan")], dtype=pf.bool).tolist() == [True, False, True]
    assert pf.tensor([1e300], dtype=pf.float32).tolist() == [float("inf")]  # floats overflow to inf
    assert pf.tensor([2**64], dtype=pf.float32).tolist() == [2.0**64]
    # tensor and array conversions wrap silently in PyTorch too
    assert pf.tensor([2**40, -1]).to(pf.int32).tolist() == [0, -1]
    assert pf.tensor(np.array([2**40]), dtype=pf.int32).tolist() == [0]
    assert pf.tensor(pf.tensor([2**40]), dtype=pf.int32).tolist() == [0]
    assert pf.tensor([float("nan")]).to(pf.int64).tolist() == [-2**63]


# ----------------------------------------------------------------- sizes
@pytest.mark.parametrize("call", [
    lambda: pf.randn(-1), lambda: pf.rand(2, -3), lambda: pf.randint(0, 3, (-1,)),
    lambda: pf.randint(3, (2, -2)), lambda: pf.zeros(2, -1), lambda: pf.empty(-1),
    lambda: pf.ones((-4,)), lambda: pf.full((-1,), 1.0)])
def test_negative_sizes_raise_like_torch(call):
    with pytest.raises(RuntimeError, match="Trying to create tensor with negative dimension"):
        call()


def test_randperm_checks_n_and_dtype():
    with pytest.raises(RuntimeError, match="n must be non-negative, got -1"):
        pf.randperm(-1)
    with pytest.raises(TypeError, match="'n' must be an int"):
        pf.randperm(2.5)
    with pytest.raises(NotImplementedError, match="bool"):
        pf.randperm(3, dtype=pf.bool)
    with pytest.raises(RuntimeError, match="cannot be greater than 2049 for float16"):
        pf.randperm(2050, dtype=pf.float16)
    assert pf.randperm(0).tolist() == []
    assert sorted(pf.randperm(2049, dtype=pf.float16).tolist()) == list(range(2049))
    with pytest.raises(RuntimeError, match="out of bounds for int32"):
        pf.randint(0, 2**40, (2,), dtype=pf.int32)
    with pytest.raises(RuntimeError, match="out of bounds for int32"):
        pf.randint(-2**40, 0, (2,), dtype=pf.int32)


# ----------------------------------------------------------------- random draws: numbers, memory
@pytest.mark.parametrize("n", [0, 5, 65536 * 2 + 3])          # one piece, several pieces
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_rand_randn_give_the_numbers_of_one_float64_draw(n, dtype):
    """Drawing in pieces (pyflow.random.fill) gives exactly the numbers of NumPy's one
    float64 call cast to the dtype, and leaves the generator where that call would:
    a seed gives the same tensors as before the change."""
    dt = getattr(pf, dtype)
    for op, kind in ((pf.rand, "random"), (pf.randn, "standard_normal")):
        pf.manual_seed(1234)
        got = op(n, dtype=dt, device="cpu")
        after = pf.rand(3, dtype=pf.float64, device="cpu")
        rng = np.random.Generator(np.random.Philox(1234))
        want = pf.tensor(getattr(rng, kind)(n).astype(np.float32 if dt.bits < 64 else np.float64),
                         dtype=dt, device="cpu")
        assert got.dtype is dt and got.shape == (n,)
        np.testing.assert_array_equal(got.float().numpy(), want.float().numpy())
        np.testing.assert_array_equal(after.numpy(), rng.random(3))


@pytest.mark.parametrize("dtype", ["int64", "int32", "float32", "bfloat16"])
def test_randint_randperm_give_the_numbers_of_one_int64_draw(dtype):
    dt = getattr(pf, dtype)
    n = 65536 * 2 + 3
    pf.manual_seed(99)
    got = pf.randint(-5, 200, (n,), dtype=dt, device="cpu")
    rng = np.random.Generator(np.random.Philox(99))
    want = rng.integers(-5, 200, size=n)
    np.testing.assert_array_equal(got.float().numpy() if dt.is_floating_point else got.numpy(),
                                  want)
    perm = pf.randperm(300 if dt is not pf.bfloat16 else 257, dtype=dt, device="cpu")
    want = rng.permutation(300 if dt is not pf.bfloat16 else 257)
    np.testing.assert_array_equal(perm.float().numpy() if dt.is_floating_point else perm.numpy(),
                                  want)


@pytest.mark.parametrize("op", ["randn", "rand", "randint"])
def test_random_creation_needs_little_memory_beyond_the_result(op):
    """A float32 randn of 4M elements made a float64 array (2x) and then the float32
    result: 3x the result at its peak.  Drawn in pieces, the peak is the result plus
    one 512 KiB piece."""
    import tracemalloc
    n = 1 << 22
    dtype = pf.int32 if op == "randint" else pf.float32
    args = (0, 10, (n,)) if op == "randint" else (n,)
    getattr(pf, op)(*args[:-1], (16,), dtype=dtype, device="cpu")     # compiled, imported
    tracemalloc.start()
    try:
        t = getattr(pf, op)(*args, dtype=dtype, device="cpu")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    result = t._data.nbytes
    assert peak < result + (2 << 20), f"peak {peak} bytes for a {result}-byte result"
