"""pyflow.save / pyflow.load: round trips, safetensors layout, atomic writes, errors."""
import collections
import io
import json
import os
import pickle
import struct

import numpy as np
import pytest

import pyflow as pf
from pyflow.nn.parameter import Parameter
from pyflow.utils import serialization
from tests.helpers import needs_torch

DTYPES = [pf.float32, pf.float64, pf.float16, pf.bfloat16, pf.int32, pf.int64, pf.bool]


def _tensor(dtype, shape=(2, 3), seed=0):
    x = np.random.default_rng(seed).standard_normal(shape) * 3
    return pf.tensor(x > 0 if dtype is pf.bool else x, dtype=dtype)


def _same(a, b):
    assert type(a) is type(b) and a.dtype is b.dtype and tuple(a.shape) == tuple(b.shape)
    np.testing.assert_array_equal(a._data, b._data)  # storage words: exact, bf16 included
    assert a.requires_grad == b.requires_grad


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("shape", [(2, 3), (), (0, 4), (5,)])
def test_round_trip_every_dtype(dtype, shape, tmp_path):
    t = _tensor(dtype, shape)
    pf.save({"t": t, "view": _tensor(dtype, (4, 6)).t()[::2]}, tmp_path / "x")
    out = pf.load(tmp_path / "x")
    _same(out["t"], t)
    assert out["view"].is_contiguous() and tuple(out["view"].shape) == (3, 4)


def test_nested_checkpoint_round_trip(tmp_path):
    w = Parameter(pf.randn(3, 2))
    shared = pf.randn(4)
    obj = {"model": collections.OrderedDict([("fc.weight", w.detach()), ("fc.bias", shared),
                                             ("tied", shared)]),
           "optim": {"state": {0: {"step": pf.tensor(3.0), "exp_avg": pf.zeros(3, 2)}},
                     "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "foreach": None,
                                       "params": [0]}]},
           "step": 3, "name": "run", "flags": [True, False, None], "inf": float("inf"),
           "milestones": collections.Counter([3, 3, 10]), "dtype": pf.bfloat16,
           "np": np.arange(4, dtype=np.int16), "np_scalar": np.float32(2.5),
           "param": Parameter(pf.ones(2)), "grad": pf.ones(2, requires_grad=True)}
    pf.save(obj, tmp_path / "ckpt.safetensors")
    out = pf.load(tmp_path / "ckpt.safetensors")
    assert type(out["model"]) is collections.OrderedDict
    assert list(out["model"]) == ["fc.weight", "fc.bias", "tied"]
    _same(out["model"]["fc.weight"], w.detach())
    assert out["model"]["tied"] is out["model"]["fc.bias"]  # sharing survives
    assert list(out["optim"]["state"]) == [0]  # int keys stay ints
    _same(out["optim"]["state"][0]["step"], obj["optim"]["state"][0]["step"])
    assert out["optim"]["param_groups"] == [{"lr": 1e-3, "betas": (0.9, 0.999),
                                             "foreach": None, "params": [0]}]
    assert (out["step"], out["name"], out["flags"]) == (3, "run", [True, False, None])
    assert out["inf"] == float("inf") and out["milestones"] == collections.Counter([3, 3, 10])
    assert out["dtype"] is pf.bfloat16
    assert out["np"].dtype == np.int16 and out["np"].tolist() == [0, 1, 2, 3]
    assert out["np_scalar"] == np.float32(2.5) and type(out["np_scalar"]) is np.float32
    assert isinstance(out["param"], Parameter) and out["param"].requires_grad
    assert out["grad"].requires_grad and out["grad"].is_leaf


def test_file_is_plain_safetensors_with_readable_keys(tmp_path):
    import safetensors.numpy
    pf.save({"model": {"fc.weight": _tensor(pf.bfloat16)}, "optim": {"state": {
        0: {"exp_avg": pf.ones(2)}}}}, tmp_path / "c")
    arrays = safetensors.numpy.load_file(str(tmp_path / "c"))
    assert sorted(arrays) == ["model.fc.weight", "optim.state.0.exp_avg"]
    assert arrays["model.fc.weight"].dtype == np.uint16  # bf16 as its 16-bit words
    raw = (tmp_path / "c").read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    structure = json.loads(header["__metadata__"]["pyflow.structure"])
    assert "bfloat16" in json.dumps(structure)


def test_plain_safetensors_file_loads_as_flat_dict(tmp_path):
    import safetensors.numpy
    safetensors.numpy.save_file({"a": np.ones(3, np.float32), "b": np.arange(2)},
                                str(tmp_path / "plain"))
    out = pf.load(tmp_path / "plain")
    assert sorted(out) == ["a", "b"] and out["a"].dtype is pf.float32
    assert out["b"].dtype is pf.int64


def test_file_objects(tmp_path):
    buf = io.BytesIO()
    pf.save([pf.ones(2), 3], buf)
    buf.seek(0)
    out = pf.load(buf)
    assert out[1] == 3 and out[0].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_pickle_uses_rebuild_tensor(dtype):
    t = _tensor(dtype)
    _same(pickle.loads(pickle.dumps(t)), t)
    r = serialization._rebuild_tensor(np.zeros(3, np.uint16), "bfloat16", True)
    assert r.dtype is pf.bfloat16 and r.requires_grad


# ----------------------------------------------------------------- atomicity
def _leftovers(d):
    return [n for n in os.listdir(d) if n.endswith(".tmp")]


def test_crash_half_way_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    pf.save({"step": 1, "w": pf.ones(1000)}, path)
    before = path.read_bytes()

    import safetensors.numpy

    def write_half_then_fail(arrays, filename, metadata=None):
        data = safetensors.numpy.save(arrays, metadata=metadata)
        with open(filename, "wb") as f:
            f.write(data[:len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", write_half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        pf.save({"step": 2, "w": pf.zeros(1000)}, path)
    assert path.read_bytes() == before and _leftovers(tmp_path) == []
    assert pf.load(path)["step"] == 1


def test_crash_in_fsync_or_rename_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    pf.save({"step": 1}, path)
    before = path.read_bytes()
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "I/O error")))
    with pytest.raises(OSError, match="I/O error"):
        pf.save({"step": 2}, path)
    monkeypatch.setattr(os, "fsync", real_fsync)
    monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        pf.save({"step": 3}, path)
    assert path.read_bytes() == before and _leftovers(tmp_path) == []


def test_save_fsyncs_file_and_directory(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    pf.save({"a": pf.ones(2)}, tmp_path / "c")
    assert len(calls) == 2  # the temp file, then the directory after the rename
    assert _leftovers(tmp_path) == []


# ----------------------------------------------------------------- errors
def test_load_errors_name_the_path(tmp_path):
    missing = tmp_path / "nope.ckpt"
    with pytest.raises(FileNotFoundError, match="nope.ckpt"):
        pf.load(missing)
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"\x05\x00")
    with pytest.raises(RuntimeError, match="bad.ckpt' is corrupt"):
        pf.load(bad)
    good = tmp_path / "good.ckpt"
    pf.save({"w": pf.ones(100)}, good)
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(good.read_bytes()[:-50])
    with pytest.raises(RuntimeError, match="truncated.ckpt' is corrupt"):
        pf.load(truncated)
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(struct.pack("<Q", 10) + b"not json!!" + b"\x00" * 8)
    with pytest.raises(RuntimeError, match="garbage.ckpt' is corrupt"):
        pf.load(garbage)


def test_save_errors(tmp_path):
    with pytest.raises(TypeError, match=r"cannot store an object of type .*at 'a\.b'"):
        pf.save({"a": {"b": object()}}, tmp_path / "x")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        pf.save({}, tmp_path / "no" / "dir" / "x")
    assert not (tmp_path / "x").exists()
    with pytest.raises(TypeError, match="unknown dtype 'complex64'"):
        serialization._rebuild_tensor(np.zeros(2), "complex64", False)


@needs_torch
def test_optimizer_state_dict_loads_into_torch_layout(tmp_path):
    """What we write for an optimizer is torch's layout with tensors in it."""
    p = Parameter(pf.ones(3))
    opt = pf.optim.Adam([p])
    p.grad = pf.ones(3)
    opt.step()
    pf.save(opt.state_dict(), tmp_path / "o")
    sd = pf.load(tmp_path / "o")
    assert sorted(sd["state"][0]) == ["exp_avg", "exp_avg_sq", "step"]
    assert sd["state"][0]["step"].item() == 1.0 and sd["param_groups"][0]["params"] == [0]


def test_save_through_a_symlink_replaces_the_target(tmp_path):
    target = tmp_path / "ckpt-100"
    pf.save({"step": 100}, target)
    link = tmp_path / "latest"
    link.symlink_to(target)
    pf.save({"step": 101}, link)
    assert link.is_symlink() and pf.load(target)["step"] == 101


def test_a_tensor_saved_on_an_unavailable_device_needs_map_location(tmp_path):
    """torch.load's behaviour: tensors come back on the device they were saved
    from; when it is not there, the error says to pass map_location."""
    import safetensors.numpy
    path = str(tmp_path / "ckpt.safetensors")
    pf.save({"w": pf.ones(3)}, path)
    with open(path, "rb") as f:
        raw = f.read()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    meta = header.pop("__metadata__")
    structure = json.loads(meta["pyflow.structure"])
    tensor_node = structure["dict"][0][1]
    tensor_node["device"] = "cuda:0"                  # as if saved from a GPU
    meta["pyflow.structure"] = json.dumps(structure)
    arrays = safetensors.numpy.load(raw)
    safetensors.numpy.save_file(arrays, path, metadata=meta)
    if not pf.cuda.is_available():
        with pytest.raises(RuntimeError, match="map_location='cpu'"):
            pf.load(path)
    loaded = pf.load(path, map_location="cpu")
    assert loaded["w"].device.type == "cpu" and loaded["w"].tolist() == [1.0, 1.0, 1.0]
