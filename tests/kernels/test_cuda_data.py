"""The CUDA data-movement kernels (copy, index, join, embedding, dropout, cast,
optim).

Kernels run in numba's simulator in a child process (``cudasim_data.py``:
every registered kernel against the CPU kernel of the same name, on several
layouts, plus bad indices); this process checks the host-side pieces that
need no simulator: argument validation that happens before any launch, the
layout helpers, and the Philox-4x32-10 round function against the Random123
known answers (run as plain Python, the code the device function compiles).
"""
import numpy as np
import pytest

import pyflow.dtypes as dt
from pyflow.kernels import registry
from pyflow.kernels.cuda import copy as cucopy
from pyflow.kernels.cuda import dropout as cudrop
from pyflow.kernels.cuda import join as cujoin

from .cudatools import run_in_simulator

# Every CPU kernel of this family has a CUDA kernel of the same name.
FAMILY = ["gather", "scatter", "index_add", "index_select", "index", "cat", "flip", "roll",
          "tile", "tril", "triu", "one_hot", "pad_constant", "embedding", "embedding_backward",
          "dropout", "cast", "adam_step", "sgd_step"]


@pytest.mark.slow
def test_every_data_kernel_in_the_simulator():
    out = run_in_simulator("cudasim_data.py")
    assert int(out.strip().splitlines()[-1].split()[0]) > 300, out   # the checks did run


def test_every_cpu_kernel_of_the_family_has_a_cuda_kernel():
    for name in FAMILY:
        registry.get(name, "cpu")
        registry.get(name, "cuda")


@pytest.mark.parametrize("ctr,key,want", [
    ((0, 0, 0, 0), (0, 0), (0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8)),
    ((0xffffffff,) * 4, (0xffffffff,) * 2, (0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd)),
    ((0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), (0xa4093822, 0x299f31d0),
     (0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1)),
])
def test_philox_round_function_known_answers(ctr, key, want):
    words = cudrop._philox4x32(*(np.uint32(c) for c in ctr), *(np.uint32(k) for k in key))
    assert [int(w) for w in words] == list(want)
    assert all(type(w) is np.uint32 for w in words)


# ------------------------------------------------------------------ host-side validation
def test_cat_rejects_mismatched_shapes_before_launch():
    cat = registry.get("cat", "cuda")
    with pytest.raises(ValueError, match="along dimension 1, the array at index 0 has size 3"):
        cat([np.zeros((2, 3)), np.zeros((2, 4))], 0)
    with pytest.raises(ValueError, match="same number of dimensions"):
        cat([np.zeros((2, 3)), np.zeros(3)], 0)
    with pytest.raises(ValueError, match="zero-dimensional"):
        cat([np.zeros(())], 0)
    with pytest.raises(ValueError, match="axis 2 is out of bounds"):
        cat([np.zeros((2, 3))], 2)


def test_roll_tile_tril_argument_errors():
    with pytest.raises(ValueError, match="axis 3 is out of bounds"):
        registry.get("roll", "cuda")(np.zeros((2, 3)), 1, 3)
    with pytest.raises(ValueError, match="should not broadcast"):
        registry.get("roll", "cuda")(np.zeros((2, 3)), (1, 2, 3), (0, 1))
    with pytest.raises(ValueError, match="negative repetitions"):
        registry.get("tile", "cuda")(np.zeros((2, 3)), (1, -1))
    with pytest.raises(ValueError, match="at least 2 dimensions"):
        registry.get("triu", "cuda")(np.zeros(3), 0)


def test_index_kernels_reject_bad_shapes_and_dtypes_before_launch():
    with pytest.raises(ValueError, match="'src3' must be folded to 3 axes"):
        registry.get("gather", "cuda")(np.zeros((2, 3)), np.zeros((2, 3, 1), np.int64))
    with pytest.raises(ValueError, match="does not match dst3"):
        registry.get("index_add", "cuda")(np.zeros((1, 4, 2)), np.array([0, 1]),
                                          np.zeros((1, 3, 2)))
    with pytest.raises(ValueError, match="only full slices"):
        registry.get("index", "cuda")(np.zeros((3, 4)), (slice(1, 2), np.array([0])))
    with pytest.raises(IndexError, match="too many indices"):
        registry.get("index", "cuda")(np.zeros(3), (np.array([0]), np.array([0])))


def test_embedding_dropout_cast_validation():
    with pytest.raises(ValueError, match="weight must be 2-D"):
        registry.get("embedding", "cuda")(np.zeros(3, np.float32), np.array([0]))
    with pytest.raises(TypeError, match="float32 or float64"):
        registry.get("embedding_backward", "cuda")(np.zeros((2, 3), np.int64), np.array([0, 1]),
                                                   4, -1, False)
    with pytest.raises(ValueError, match=r"does not match indices of shape \(3,\)"):
        registry.get("embedding_backward", "cuda")(np.zeros((2, 3)), np.array([0, 1, 2]),
                                                   4, -1, False)
    with pytest.raises(TypeError, match="floating point"):
        registry.get("dropout", "cuda")(np.zeros(3, np.int32), np.ones(3, bool), 2.0)
    with pytest.raises(ValueError, match="between 0 and 1"):
        cudrop.dropout_philox(np.zeros(3, np.float32), 1.5, seed=0)
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\)"):
        cudrop.dropout_philox(np.zeros(3, np.float32), 0.5, seed=-1)
    with pytest.raises(TypeError, match="is not the storage of bfloat16"):
        registry.get("cast", "cuda")(np.zeros(3, np.float32), dt.bfloat16, dt.float32)


def test_optimizer_steps_validate_like_the_cpu_kernels():
    adam = registry.get("adam_step", "cuda")
    z = np.zeros(4, np.float32)
    hp = dict(step=1, lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8)
    with pytest.raises(TypeError, match="'grad' has dtype float64, expected float32"):
        adam(z.copy(), np.zeros(4), z.copy(), z.copy(), **hp)
    with pytest.raises(ValueError, match="'exp_avg_sq' has 3 elements, expected 4"):
        adam(z.copy(), z, z.copy(), z[:3].copy(), **hp)
    with pytest.raises(ValueError, match="amsgrad=True needs 'max_exp_avg_sq'"):
        adam(z.copy(), z, z.copy(), z.copy(), amsgrad=True, **hp)
    with pytest.raises(ValueError, match="Invalid learning rate"):
        adam(z.copy(), z, z.copy(), z.copy(), **dict(hp, lr=-1.0))
    with pytest.raises(ValueError, match="step must be >= 1"):
        adam(z.copy(), z, z.copy(), z.copy(), **dict(hp, step=0))
    with pytest.raises(TypeError, match="must be float32 or float64"):
        adam(np.zeros(4, np.int32), z, z, z, **hp)
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="'param' must be writeable"):
        adam(ro, z, z.copy(), z.copy(), **hp)
    sgd = registry.get("sgd_step", "cuda")
    with pytest.raises(ValueError, match="flat C-contiguous"):
        sgd(np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float32), lr=0.1)
    with pytest.raises(ValueError, match="momentum != 0 needs 'momentum_buffer'"):
        sgd(z.copy(), z, lr=0.1, momentum=0.9)


# ------------------------------------------------------------------ layout helpers
def test_is_contiguous_and_operand_spans():
    base = np.arange(24.0).reshape(2, 3, 4)
    assert cucopy.is_contiguous(base) and cucopy.is_contiguous(base[:1])
    assert not cucopy.is_contiguous(base.transpose(1, 0, 2))
    assert not cucopy.is_contiguous(base[:, :, ::2])
    assert cucopy.is_contiguous(np.broadcast_to(base[:1], (1, 3, 4)))   # size-1 dims don't count
    view, off, st = cucopy.operand(base[::-1, :, 1::2])
    assert st == [-12, 4, 2] and view[off] == base[1, 0, 1]
    view, off, st = cucopy.operand(np.broadcast_to(np.arange(4.0), (3, 4)))
    assert st == [0, 1] and off == 0
    assert cucopy.pad_dims((), (), ()) == ((1,), [(0,), (0,)])


def test_pad_box_of_step1_slices():
    assert cujoin._box((slice(1, 3), slice(None)), (5, 4), "k") == ([1, 0], [2, 4])
    assert cujoin._box((slice(2, 2),), (5, 4), "k") == ([2, 0], [0, 4])
    assert cujoin._box((slice(0, 6, 2),), (6,), "k") is None
