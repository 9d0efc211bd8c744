"""pyflow.save / pyflow.load: round trips, safetensors layout, atomic writes, errors."""
import collections
import io
import json
import os
import pickle
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

import pyflow as pf
from pyflow.nn.parameter import Parameter
from pyflow.utils import serialization
from tests.helpers import needs_torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
    """Anything but the checkpoints themselves: pyflow's temporary files and
    any other writer's (safetensors' own ``.tmpXXXXXX``)."""
    return [n for n in os.listdir(d) if "tmp" in n]


def test_crash_half_way_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "ckpt"
    pf.save({"step": 1, "w": pf.ones(1000)}, path)
    before = path.read_bytes()
    real_write = serialization._safetensors.write

    def write_half_then_fail(f, arrays, metadata):   # the disk fills half way
        buf = io.BytesIO()
        real_write(buf, arrays, metadata)
        f.write(buf.getvalue()[:len(buf.getvalue()) // 2])
        f.flush()
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(serialization._safetensors, "write", write_half_then_fail)
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


# ----------------------------------------------------------------- temporary files
def _dead_pid():
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_one_recognisable_temporary_file_written_by_pyflow(tmp_path, monkeypatch):
    """The safetensors package's file writers (which make temporary files of
    their own) are not used; during the write there is exactly one
    temporary file, named for the checkpoint and this process."""
    import safetensors.numpy

    def refuse(*a, **k):
        raise AssertionError("safetensors' own file writer was used")

    monkeypatch.setattr(safetensors.numpy, "save_file", refuse)
    monkeypatch.setattr(safetensors.numpy, "serialize_file", refuse)
    seen = []
    real_write = serialization._safetensors.write

    def spy(f, arrays, metadata):
        real_write(f, arrays, metadata)
        seen.append(sorted(os.listdir(tmp_path)))

    monkeypatch.setattr(serialization._safetensors, "write", spy)
    pf.save({"w": pf.ones(10)}, tmp_path / "ckpt.safetensors")
    [names] = seen
    assert len(names) == 1
    assert re.fullmatch(rf"ckpt\.safetensors\.pyflow-tmp-{os.getpid()}-[0-9a-f]{{8}}", names[0])
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]


def test_stale_temporary_files_are_removed_by_the_next_save(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    dead, me = _dead_pid(), os.getpid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {
            f"ckpt.safetensors.pyflow-tmp-{dead}-0123abcd": False,     # writer killed
            f"ckpt.safetensors.pyflow-tmp-{me}-89abcdef": False,       # ours, not in progress
            ".ckpt.safetensors." + "a" * 32 + ".tmp": False,           # the old naming
            f"ckpt.safetensors.pyflow-tmp-{live.pid}-0123abcd": True,  # a live writer's
            f"other.pyflow-tmp-{dead}-0123abcd": True,                 # another checkpoint's
            "ckpt.safetensors.pyflow-tmp-notes.txt": True,             # not our pattern
        }
        for name in names:
            (tmp_path / name).write_bytes(b"x" * 100)
        assert sorted(t for t, _ in serialization.temporary_files(path)) == sorted(
            str(tmp_path / n) for n in names if n.startswith(("ckpt", ".ckpt"))
            and not n.endswith(".txt"))
        pf.save({"step": 1}, path)
        assert sorted(os.listdir(tmp_path)) == sorted(
            ["ckpt.safetensors"] + [n for n, kept in names.items() if kept])
        assert pf.load(path) == {"step": 1}
    finally:
        live.kill()
        live.wait()
    # the live writer has gone: its file is stale now
    assert serialization.remove_stale_temporaries(path) == [
        str(tmp_path / f"ckpt.safetensors.pyflow-tmp-{live.pid}-0123abcd")]


_FULL_DISK = r"""
import errno, resource, signal, sys
import pyflow as pf
path = sys.argv[1]
pf.save({"step": 1, "w": pf.ones(10)}, path)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)       # a write past the limit fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
try:
    pf.save({"step": 2, "w": pf.zeros(1 << 20)}, path)   # 4 MiB: does not fit
except OSError as e:
    print("OSError", errno.errorcode.get(e.errno), type(e).__name__)
except BaseException as e:
    print("other", type(e).__module__, type(e).__name__, e)
else:
    print("saved")
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ are Linux's")
def test_a_write_the_file_system_refuses_is_an_oserror(tmp_path):
    """A real failing write (the file size limit, as a full disk would): an
    OSError from pyflow.save, not safetensors' SafetensorError; the old
    checkpoint intact and the partial temporary file removed."""
    path = tmp_path / "ckpt"
    proc = subprocess.run([sys.executable, "-c", _FULL_DISK, str(path)], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["OSError", "EFBIG", "OSError"], proc.stdout
    assert pf.load(path)["step"] == 1 and _leftovers(tmp_path) == []


# ----------------------------------------------------------------- streams
class _Stream(io.RawIOBase):
    """A pipe-like stream (not seekable): ``prefix``, then endless ``fill``
    bytes (none: the stream ends).  Refuses unbounded reads and counts what
    it gave."""

    def __init__(self, prefix=b"", fill=b"\0", limit=1 << 24):
        self.prefix, self.fill, self.limit, self.given = prefix, fill, limit, 0

    def readable(self):
        return True

    def readinto(self, b):
        head = self.prefix[self.given:self.given + len(b)]
        n = len(b) if self.fill else len(head)
        assert self.given + n <= self.limit, "load read far past what the header describes"
        b[:n] = head + self.fill * (n - len(head))
        self.given += n
        return n

    def read(self, n=-1):
        assert n is not None and n >= 0, "load asked for the whole of an endless stream"
        return super().read(n)


def _checkpoint_bytes(obj):
    buf = io.BytesIO()
    pf.save(obj, buf)
    return buf.getvalue()


def test_load_reads_only_the_bytes_its_header_describes():
    raw = _checkpoint_bytes({"w": pf.arange(6.0), "step": 4})
    stream = _Stream(raw, fill=b"\xab")
    out = pf.load(stream)
    assert out["step"] == 4 and out["w"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert stream.given == len(raw)
    # two checkpoints back to back in one stream
    buf = io.BytesIO(raw + _checkpoint_bytes({"step": 5}))
    assert pf.load(buf)["step"] == 4 and pf.load(buf) == {"step": 5}


def test_endless_or_short_streams_fail_cleanly():
    stream = _Stream(fill=b"\xff")                         # header length 2**64 - 1
    with pytest.raises(RuntimeError, match="is corrupt.*header length .* over the bound"):
        pf.load(stream)
    assert stream.given == 8
    raw = _checkpoint_bytes({"w": pf.ones(1000)})
    for cut in (3, 20, len(raw) - 1):
        with pytest.raises(RuntimeError, match="'BytesIO' is corrupt.*truncated"):
            pf.load(io.BytesIO(raw[:cut]))
    # a header promising 1 TB of tensor over a stream that ends: no 1 TB allocation
    header = json.dumps({"w": {"dtype": "F32", "shape": [1 << 38],
                               "data_offsets": [0, 1 << 40]}}).encode()
    short = _Stream(struct.pack("<Q", len(header)) + header + b"\0" * 100, fill=b"")
    with pytest.raises(RuntimeError, match="truncated: the file ends .* into the tensor data"):
        pf.load(short)


# ----------------------------------------------------------------- format
def test_files_match_the_safetensors_package_both_ways(tmp_path):
    import safetensors.numpy
    from safetensors import safe_open
    arrays = {f"k{i}": (np.arange(i + 1) % 3).astype(d) for i, d in enumerate(
        [np.float32, np.int8, np.float64, np.uint16, np.bool_, np.int64, np.float16, np.uint8])}
    arrays.update({"empty": np.zeros((0, 3), np.float32), "scalar": np.array(2.5),
                   "é": np.ones(2), "big_endian": np.arange(3, dtype=">i4")})
    buf = io.BytesIO()
    serialization._safetensors.write(buf, arrays, {"a": "b"})
    theirs = safetensors.numpy.load(buf.getvalue())
    assert sorted(theirs) == sorted(arrays)
    for k, a in arrays.items():
        assert theirs[k].dtype == a.dtype.newbyteorder("<") and theirs[k].shape == a.shape, k
        np.testing.assert_array_equal(theirs[k], a)
    raw = buf.getvalue()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0                                      # the data starts aligned
    for k, info in json.loads(raw[8:8 + n]).items():
        if k != "__metadata__":
            assert info["data_offsets"][0] % np.dtype(arrays[k].dtype).itemsize == 0, k
    (tmp_path / "f").write_bytes(raw)
    with safe_open(str(tmp_path / "f"), framework="numpy") as f:
        assert f.metadata() == {"a": "b"}
    meta, back, dtypes = serialization._safetensors.read(
        io.BytesIO(safetensors.numpy.save(arrays, metadata={"a": "b"})))
    assert meta == {"a": "b"} and dtypes["k0"] == "F32"
    for k, a in arrays.items():
        np.testing.assert_array_equal(back[k], a)


@needs_torch
def test_a_bfloat16_safetensors_file_from_torch_loads_as_bfloat16(tmp_path):
    import torch
    import safetensors.torch
    t = torch.tensor([1.5, -2.0, 3.25], dtype=torch.bfloat16)
    safetensors.torch.save_file({"w": t}, str(tmp_path / "bf16"))
    out = pf.load(tmp_path / "bf16")
    assert out["w"].dtype is pf.bfloat16 and out["w"].float().tolist() == [1.5, -2.0, 3.25]


def test_save_refuses_scalars_and_nesting_it_cannot_load(tmp_path):
    for bad in (np.void(b"ab"), np.complex64(1j), np.datetime64("2024-01-01"), np.bytes_(b"x")):
        with pytest.raises(TypeError, match="cannot store an object of type"):
            pf.save({"x": bad}, tmp_path / "x")
    loop = []
    loop.append(loop)
    with pytest.raises(ValueError, match="nest more than 100 deep"):
        pf.save(loop, tmp_path / "x")
    deep = 1
    for _ in range(serialization.MAX_DEPTH):
        deep = [deep]
    pf.save(deep, tmp_path / "x")                          # the deepest allowed round-trips
    assert pf.load(tmp_path / "x") == deep
    with pytest.raises(ValueError, match="nest more than"):
        pf.save([deep], tmp_path / "x")
    assert pf.load(tmp_path / "x") == deep and _leftovers(tmp_path) == []
    s = {"u": np.str_("abc"), "b": np.bool_(True), "u8": np.uint8(7), "f16": np.float16(0.5)}
    pf.save(s, tmp_path / "x")
    out = pf.load(tmp_path / "x")
    assert out == s and [type(v) for v in out.values()] == [type(v) for v in s.values()]
