"""Dropout's counter-based masks: Philox-4x32-10 known answers on both backends,
the CPU kernel against a NumPy reference of the documented scheme, host-side
validation of both kernels, the cuda == cpu comparison in numba's simulator
(``cudasim_dropout.py``, a child process), and PTX of the fused kernel.

(Every dropout kernel is also compiled to PTX for sm_80 / sm_90 and each dtype
in ``test_cuda_data_ptx.py``.)
"""
import numpy as np
import pytest
from numba import types as nb

from pyflow.kernels import registry
from pyflow.kernels.cpu import dropout as cpudrop
from pyflow.kernels.cuda import dropout as cudrop
from tests.ops.test_dropout_embedding import philox_mask_reference

from .cudatools import compile_ptx_all, run_in_simulator

# Random123 tests/kat_vectors, the "philox4x32 10" lines: counter, key, result.
KAT = [((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
       ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
       ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
        (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1))]


@pytest.mark.slow
def test_cpu_and_cuda_masks_match_in_the_simulator():
    out = run_in_simulator("cudasim_dropout.py")
    assert int(out.strip().splitlines()[-1].split()[0]) >= 170, out   # the checks did run


@pytest.mark.parametrize("ctr,key,want", KAT)
def test_cpu_philox_known_answers(ctr, key, want):
    assert cpudrop.philox_words(ctr, key) == list(want)        # the numba-compiled function
    words = cpudrop.philox4x32(*(np.uint32(c) for c in ctr), *(np.uint32(k) for k in key))
    assert [int(w) for w in words] == list(want)               # the same source as Python


def test_both_backends_register_one_round_function():
    assert registry.get("dropout_philox", "cpu") is cpudrop.dropout_philox
    assert registry.get("dropout_philox", "cuda") is cudrop.dropout_philox
    assert cudrop._philox4x32 is cpudrop.philox4x32


@pytest.mark.parametrize("seed,offset", [(0, 0), (2**64 - 1, 2**33 + 5), (0x1234_5678_9ABC, 1)])
@pytest.mark.parametrize("p", [0.0, 0.3, 0.999, 1.0])
def test_cpu_kernel_follows_the_documented_scheme(seed, offset, p):
    x = np.random.default_rng(seed % 2**32).uniform(0.5, 2.0, (7, 9))
    out, keep = registry.get("dropout_philox", "cpu")(x, p, seed, offset)
    want = philox_mask_reference(x.size, p, seed, offset).reshape(x.shape)
    assert keep.dtype == np.bool_ and np.array_equal(keep, want)
    scale = 0.0 if p == 1.0 else 1 / (1 - p)
    np.testing.assert_array_equal(out, np.where(want, x * scale, 0.0))


def test_cpu_mask_depends_on_logical_index_only():
    """Layouts and dtypes change nothing; another seed or offset changes the mask."""
    kern = registry.get("dropout_philox", "cpu")
    x = np.random.default_rng(1).uniform(0.5, 2.0, (6, 10))
    keep = kern(x, 0.5, 77, 2)[1]
    assert np.array_equal(kern(np.asfortranarray(x), 0.5, 77, 2)[1], keep)
    assert np.array_equal(kern(np.repeat(x, 2, axis=1)[:, ::2], 0.5, 77, 2)[1], keep)
    out16, keep16 = kern(x.astype(np.float16), 0.5, 77, 2)
    assert np.array_equal(keep16, keep) and out16.dtype == np.float16
    assert np.array_equal(out16, np.where(keep, x.astype(np.float16) * np.float16(2), 0))
    assert (kern(x, 0.5, 78, 2)[1] != keep).mean() > 0.2
    assert (kern(x, 0.5, 77, 3)[1] != keep).mean() > 0.2
    assert kern(np.zeros((0, 4), np.float32), 0.5, 1)[1].shape == (0, 4)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_kernels_validate_before_launch(device):
    kern = registry.get("dropout_philox", device)
    x = np.zeros(3, np.float32)
    with pytest.raises(ValueError, match="between 0 and 1, but got 1.5"):
        kern(x, 1.5, seed=0)
    with pytest.raises(ValueError, match="between 0 and 1"):
        kern(x, float("nan"), seed=0)
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\), got -1"):
        kern(x, 0.5, seed=-1)
    with pytest.raises(ValueError, match=r"offset must be in \[0, 2\*\*64\), got 1844674407"):
        kern(x, 0.5, 0, 2**64)
    with pytest.raises(TypeError, match="seed must be an int, got float"):
        kern(x, 0.5, seed=1.5)
    with pytest.raises(TypeError, match="floating point array .* got int64"):
        kern(np.zeros(3, np.int64), 0.5, seed=0)
    with pytest.raises(ValueError, match=r"keep mask of shape \(4,\) does not match x of shape"):
        registry.get("dropout", device)(x, np.ones(4, bool), 2.0)


def test_fused_kernel_uses_32_bit_products(monkeypatch):
    """Philox's 32x32->64 products must stay ``mul.wide.u32`` (two per round),
    not full 64-bit multiplies, and float32 data must not touch float64."""
    a = lambda t: t[::1]  # noqa: E731
    W32, F32 = nb.uint32, nb.float32
    B = nb.boolean
    sig = (a(F32), a(B), a(F32), a(F32), a(F32), B, B, nb.int64, F32, F32, F32, W32, W32, W32,
           W32)
    ptxes = compile_ptx_all(cudrop.KERNEL_FACTORIES["bias_dropout_add_philox"](), sig,
                            monkeypatch)
    for (major, minor), ptx in ptxes.items():
        sm = f"sm_{major}{minor}"
        lines = [ln.strip() for ln in ptx.splitlines()]
        assert sum(ln.startswith("mul.wide.u32") for ln in lines) >= 2 * (cpudrop.ROUNDS - 1), sm
        assert not [ln for ln in lines if ln.startswith(("mul.lo.u64", "mul.hi.u64"))], sm
        assert not [ln for ln in lines if ".f64" in ln], sm
