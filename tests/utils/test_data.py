"""utils.data: datasets, samplers, default_collate and DataLoader."""
import collections

import numpy as np
import pytest
from hypothesis import given, strategies as st

import pyflow as pf
from pyflow.utils.data import (BatchSampler, ConcatDataset, DataLoader, Dataset,
                               IterableDataset, RandomSampler, SequentialSampler, Subset,
                               TensorDataset, default_collate, random_split)
from tests.helpers import assert_close, needs_torch, torch


def _dataset(n=10):
    x = pf.tensor(np.arange(n * 3, dtype=np.float32).reshape(n, 3))
    y = pf.tensor(np.arange(n))
    return TensorDataset(x, y)


@given(n=st.integers(1, 23), batch_size=st.integers(1, 8), drop_last=st.booleans())
def test_batches_cover_the_dataset_in_order(n, batch_size, drop_last):
    loader = DataLoader(_dataset(n), batch_size=batch_size, drop_last=drop_last)
    batches = list(loader)
    expected = n // batch_size if drop_last else -(-n // batch_size)
    assert len(loader) == len(batches) == expected
    seen = [int(i) for _, y in batches for i in y.tolist()]
    assert seen == list(range(len(seen)))
    assert len(seen) == (expected * batch_size if drop_last else n)
    for x, y in batches:
        assert x.dtype is pf.float32 and y.dtype is pf.int64
        assert tuple(x.shape) == (len(y), 3)
        assert_close(x, np.arange(3)[None, :] + 3 * y.cpu().numpy()[:, None])


def test_shuffle_is_a_permutation_reproducible_from_the_seed():
    ds = _dataset(17)

    def order(**kw):
        return [i for _, y in DataLoader(ds, batch_size=4, shuffle=True, **kw)
                for i in y.tolist()]

    pf.manual_seed(0)
    a, a2 = order(), order()
    pf.manual_seed(0)
    b = order()
    assert sorted(a) == list(range(17)) and a != list(range(17))
    assert a == b and a != a2  # same seed -> same orders; each epoch reshuffles
    g = pf.Generator().manual_seed(5)
    c = order(generator=g)
    g.manual_seed(5)
    assert order(generator=g) == c


def test_samplers():
    assert list(SequentialSampler(range(4))) == [0, 1, 2, 3]
    rs = RandomSampler(range(6), generator=pf.Generator().manual_seed(1))
    assert len(rs) == 6 and sorted(rs) == list(range(6))
    rs = RandomSampler(range(3), num_samples=7, generator=pf.Generator().manual_seed(1))
    draws = list(rs)
    assert len(draws) == len(rs) == 7 and all(draws.count(i) >= 2 for i in range(3))
    rr = RandomSampler(range(3), replacement=True, num_samples=20)
    assert len(list(rr)) == 20 and set(rr) <= {0, 1, 2}
    bs = BatchSampler(SequentialSampler(range(7)), 3, drop_last=False)
    assert list(bs) == [[0, 1, 2], [3, 4, 5], [6]] and len(bs) == 3
    assert list(BatchSampler(range(7), 3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]


def test_custom_sampler_and_batch_sampler():
    ds = _dataset(6)
    loader = DataLoader(ds, batch_size=2, sampler=[5, 4, 3, 2, 1, 0])
    assert [y.tolist() for _, y in loader] == [[5, 4], [3, 2], [1, 0]]
    loader = DataLoader(ds, batch_sampler=[[0, 3], [1, 2, 5]])
    assert [y.tolist() for _, y in loader] == [[0, 3], [1, 2, 5]] and len(loader) == 2


def test_default_collate_structures():
    Point = collections.namedtuple("Point", "x y")
    samples = [{"img": np.full((2, 2), i, np.float32), "label": i, "w": 0.5 * i,
                "name": f"s{i}", "pair": (pf.tensor([i, i + 1]), np.int32(i)),
                "pt": Point(i, [i * 1.0])} for i in range(3)]
    b = default_collate(samples)
    assert b["img"].dtype is pf.float32 and tuple(b["img"].shape) == (3, 2, 2)
    assert b["label"].dtype is pf.int64 and b["label"].tolist() == [0, 1, 2]
    assert b["w"].dtype is pf.float64 and b["w"].tolist() == [0.0, 0.5, 1.0]
    assert b["name"] == ["s0", "s1", "s2"]
    assert isinstance(b["pair"], list) and b["pair"][0].tolist() == [[0, 1], [1, 2], [2, 3]]
    assert b["pair"][1].dtype is pf.int32
    assert isinstance(b["pt"], Point) and b["pt"].x.tolist() == [0, 1, 2]
    assert b["pt"].y[0].tolist() == [0.0, 1.0, 2.0]
    assert default_collate([True, False]).dtype is pf.bool


@pytest.mark.parametrize("dtype", [pf.float16, pf.bfloat16, pf.int32, pf.bool, pf.float64])
def test_collate_keeps_every_dtype_exactly(dtype):
    xs = [pf.tensor(np.array([1.5, -2.0, 0.0]) * i, dtype=dtype) for i in range(3)]
    out = default_collate(xs)
    assert out.dtype is dtype
    np.testing.assert_array_equal(out._data, np.stack([x._data for x in xs]))


def test_collate_errors():
    with pytest.raises(RuntimeError, match=r"stack expects each tensor to be equal size, but "
                                           r"got \[2\] at entry 0 and \[3\] at entry 1"):
        default_collate([pf.ones(2), pf.ones(3)])
    with pytest.raises(RuntimeError, match="each element in list of batch should be of equal"):
        default_collate([[1, 2], [1]])
    with pytest.raises(TypeError, match="found <class 'object'>"):
        default_collate([object(), object()])
    with pytest.raises(ValueError, match="empty batch"):
        default_collate([])


def test_collate_fn_and_no_auto_batching():
    ds = _dataset(4)
    loader = DataLoader(ds, batch_size=3, collate_fn=lambda b: len(b))
    assert list(loader) == [3, 1]
    samples = list(DataLoader(ds, batch_size=None))
    assert len(samples) == 4 and tuple(samples[0][0].shape) == (3,)


def test_iterable_dataset():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(7))

    assert [b.tolist() for b in DataLoader(Stream(), batch_size=3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert len(list(DataLoader(Stream(), batch_size=3, drop_last=True))) == 2
    with pytest.raises(ValueError, match="expected unspecified shuffle option"):
        DataLoader(Stream(), shuffle=True)


def test_subset_concat_random_split():
    ds = _dataset(10)
    sub = Subset(ds, [9, 0])
    assert len(sub) == 2 and sub[0][1].item() == 9
    cat = ConcatDataset([ds, sub])
    assert len(cat) == 12 and cat[10][1].item() == 9 and cat[-1][1].item() == 0
    parts = random_split(ds, [3, 7], generator=pf.Generator().manual_seed(0))
    idx = sorted(parts[0].indices + parts[1].indices)
    assert [len(p) for p in parts] == [3, 7] and idx == list(range(10))
    parts = random_split(range(11), [0.5, 0.5])
    assert [len(p) for p in parts] == [6, 5]
    with pytest.raises(ValueError, match="does not equal the length of the input dataset"):
        random_split(ds, [3, 3])


def test_dataset_protocol():
    class Squares(Dataset):
        def __getitem__(self, i):
            return np.array([i * i], np.float64)

        def __len__(self):
            return 5

    batches = list(DataLoader(Squares(), batch_size=2))
    assert batches[0].dtype is pf.float64 and batches[2].tolist() == [[16.0]]


def test_bad_arguments():
    ds = _dataset(4)
    with pytest.raises(ValueError, match="batch_size should be a positive integer"):
        DataLoader(ds, batch_size=0)
    with pytest.raises(ValueError, match="sampler option is mutually exclusive with shuffle"):
        DataLoader(ds, sampler=[0, 1], shuffle=True)
    with pytest.raises(ValueError, match="batch_sampler option is mutually exclusive"):
        DataLoader(ds, batch_sampler=[[0]], batch_size=2)
    with pytest.raises(ValueError, match="num_workers option should be non-negative"):
        DataLoader(ds, num_workers=-1)
    with pytest.raises(ValueError, match="Size mismatch between tensors"):
        TensorDataset(pf.ones(3), pf.ones(4))
    with pytest.raises(TypeError, match="argument 1 must be a Tensor"):
        TensorDataset(pf.ones(3), [1, 2, 3])
    with pytest.raises(ValueError, match="num_samples should be a positive integer"):
        RandomSampler([])


@needs_torch
def test_batches_equal_torch_dataloader_without_shuffle():
    x = np.random.default_rng(0).standard_normal((9, 2)).astype(np.float32)
    ours = list(DataLoader(TensorDataset(pf.tensor(x)), batch_size=4))
    theirs = list(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.tensor(x)),
                                              batch_size=4))
    for (a,), (b,) in zip(ours, theirs):
        np.testing.assert_array_equal(a.cpu().numpy(), b.cpu().numpy())


@pytest.mark.skipif(not hasattr(pf, "stack"), reason="pyflow.stack not built yet")
def test_collating_tensors_that_require_grad_keeps_the_tape():
    a, b = pf.ones(2, requires_grad=True), pf.ones(2, requires_grad=True)
    (default_collate([a, b]) * pf.tensor([[1.0], [3.0]])).sum().backward()
    assert a.grad.tolist() == [1.0, 1.0] and b.grad.tolist() == [3.0, 3.0]
