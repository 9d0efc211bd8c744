"""pyflow.load on damaged and crafted files: every defect is the one error
("load: '<file>' is corrupt ...", a RuntimeError), raised quickly and
without large allocations; never a RecursionError, a bare TypeError or a
NumPy object built to a size the file names.

Crafted files are written with the safetensors package (not pyflow), so
they are valid safetensors files whose *pyflow* content is hostile; the
hypothesis families mutate the bytes, the header entries and the structure
tree of a real checkpoint."""
import io
import json
import math
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyflow as pf

CORRUPT = "is corrupt or not a safetensors checkpoint"
SECONDS_PER_LOAD = 2.0   # a ~2 KB file: far more than any honest load takes


def _meta(structure_text):
    return {"format": "pyflow", "pyflow.version": "1", "pyflow.structure": structure_text}


def _craft(path, structure_text, arrays=None):
    import safetensors.numpy
    safetensors.numpy.save_file(arrays or {"w": np.ones(3, np.float32)}, str(path),
                                metadata=_meta(structure_text))
    return path


def _file_bytes(header, data=b""):
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _load_both(path):
    """Load ``path`` as a path and as a stream; the same outcome both ways."""
    results = []
    for source in (str(path), io.BytesIO(open(path, "rb").read())):
        t0 = time.perf_counter()
        try:
            results.append(("ok", pf.load(source)))
        except Exception as e:      # noqa: BLE001 (the test is which exception)
            results.append((type(e), str(e)))
        assert time.perf_counter() - t0 < SECONDS_PER_LOAD
    return results


def _assert_corrupt(path, match=""):
    for source, name in ((str(path), str(path)), (io.BytesIO(open(path, "rb").read()), "BytesIO")):
        with pytest.raises(RuntimeError, match=f"'{name}' {CORRUPT}.*{match}"):
            pf.load(source)


# ----------------------------------------------------------------- crafted structure
W = {"tensor": "w", "dtype": "float32"}
CRAFTED_STRUCTURES = {
    # the crafted file: np.void(2**31 - 1) is a 2 GiB scalar of zeros
    "void_scalar": (json.dumps({"np_scalar": "V8", "value": 2 ** 31 - 1}), "NumPy scalar"),
    "void_dtype": (json.dumps({"np_scalar": "V2147483647", "value": 1}), "NumPy scalar"),
    "object_scalar": (json.dumps({"np_scalar": "O", "value": 1}), "NumPy scalar"),
    "subarray_scalar": (json.dumps({"np_scalar": "(1000000,)f8", "value": 1.0}), "NumPy scalar"),
    "scalar_from_list": (json.dumps({"np_scalar": "<f8", "value": [1.0] * 1000}), "scalar"),
    "scalar_overflow": (json.dumps({"np_scalar": "<i4", "value": 2 ** 40}), "scalar"),
    "scalar_no_dtype": (json.dumps({"np_scalar": ["<f8"], "value": 1.0}), "scalar"),
    "deep_nesting": ('{"list":[' * 100_000 + "1" + "]}" * 100_000, ""),
    "deep_json": ("[" * 100_000 + "]" * 100_000, "structure"),
    "over_max_depth": ('{"list":[' * 101 + "1" + "]}" * 101, "nest more than 100"),
    "unhashable_key": (json.dumps({"dict": [[{"list": []}, 1]], "type": "dict"}), "unhashable"),
    "dict_key_is_dict": (json.dumps({"dict": [[{"dict": [], "type": "dict"}, 1]]}), "unhashable"),
    "dict_item_not_pair": (json.dumps({"dict": [[1]], "type": "dict"}), "pair"),
    "dict_items_not_list": (json.dumps({"dict": {"a": 1}, "type": "dict"}), "list"),
    "unknown_dict_type": (json.dumps({"dict": [], "type": "defaultdict"}), "dict type"),
    "missing_tensor": (json.dumps({"tensor": "nope", "dtype": "float32"}), "missing"),
    "unknown_tensor_dtype": (json.dumps({"tensor": "w", "dtype": "complex64"}), "dtype"),
    "storage_mismatch": (json.dumps({"tensor": "w", "dtype": "int64"}), "stored as"),
    "int_requires_grad": (None, "w"),   # built below: an int tensor that requires grad
    "tensor_key_not_str": (json.dumps({"tensor": 5, "dtype": "float32"}), "not a key"),
    "requires_grad_not_bool": (json.dumps({**W, "requires_grad": "yes"}), "requires_grad"),
    "bad_device": (json.dumps({**W, "device": "tpu:0"}), "device"),
    "device_not_str": (json.dumps({**W, "device": ["cpu"]}), "device"),
    "unknown_node": (json.dumps({"pickle": "os.system"}), "node"),
    "extra_field": (json.dumps({"list": [], "exec": 1}), "node"),
    "bare_list": (json.dumps([1, 2]), "list node"),
    "unknown_dtype_node": (json.dumps({"dtype": "float128"}), "dtype"),
    "not_json": ("{", "bad structure"),
    "list_node_not_list": (json.dumps({"list": 5}), "list"),
}


@pytest.mark.parametrize("case", sorted(CRAFTED_STRUCTURES))
def test_crafted_structure_is_reported_as_corrupt(case, tmp_path):
    text, match = CRAFTED_STRUCTURES[case]
    arrays = None
    if case == "int_requires_grad":
        text = json.dumps({"tensor": "w", "dtype": "int64", "requires_grad": True})
        arrays = {"w": np.ones(3, np.int64)}
    path = _craft(tmp_path / f"{case}.ckpt", text, arrays)
    t0 = time.perf_counter()
    _assert_corrupt(path, match)
    assert time.perf_counter() - t0 < 2 * SECONDS_PER_LOAD


# ----------------------------------------------------------------- crafted header
def _entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


CRAFTED_HEADERS = {
    "size_mismatch": ({"w": _entry(shape=[3])}, b"\0" * 8, "does not fill"),
    "huge_shape": ({"w": _entry(shape=[1 << 40, 1 << 40])}, b"\0" * 8, "does not fill"),
    "gap": ({"a": _entry(offsets=[0, 8]), "b": _entry(offsets=[16, 24])}, b"\0" * 24, "gap"),
    "overlap": ({"a": _entry(offsets=[0, 8]), "b": _entry(offsets=[4, 12])}, b"\0" * 12, "gap"),
    "negative_offset": ({"w": _entry(offsets=[-8, 0])}, b"", "data_offsets"),
    "bool_shape": ({"w": _entry(shape=[True, 2], offsets=[0, 8])}, b"\0" * 8, "shape"),
    "float_offsets": ({"w": _entry(offsets=[0.0, 8.0])}, b"\0" * 8, "data_offsets"),
    "too_many_dims": ({"w": _entry(shape=[1] * 40, offsets=[0, 4])}, b"\0" * 4, "shape"),
    "unknown_dtype": ({"w": _entry(dtype="X9")}, b"\0" * 8, "dtype"),
    "entry_not_object": ({"w": [1, 2]}, b"", "entry"),
    "metadata_not_strings": ({"__metadata__": {"format": 1}}, b"", "__metadata__"),
    "header_not_object": ([1, 2, 3], b"", "not a JSON object"),
    "truncated_data": ({"w": _entry()}, b"\0" * 5, "truncated"),
    "stray_bytes": ({"w": _entry()}, b"\0" * 9, "stray"),   # a path only: a stream may go on
}


@pytest.mark.parametrize("case", sorted(CRAFTED_HEADERS))
def test_crafted_header_is_reported_as_corrupt(case, tmp_path):
    header, data, match = CRAFTED_HEADERS[case]
    path = tmp_path / f"{case}.ckpt"
    path.write_bytes(_file_bytes(header, data))
    if case == "stray_bytes":
        with pytest.raises(RuntimeError, match=f"{CORRUPT}.*{match}"):
            pf.load(path)
        assert pf.load(io.BytesIO(path.read_bytes()))["w"].tolist() == [0.0, 0.0]
        return
    _assert_corrupt(path, match)


def test_header_length_is_checked_before_reading(tmp_path):
    path = tmp_path / "long.ckpt"
    path.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    _assert_corrupt(path, "header length 1099511627776 is over the bound")
    path.write_bytes(struct.pack("<Q", 1 << 20) + b"{}")
    with pytest.raises(RuntimeError, match="truncated: a header of 1048576 bytes in a file of 10"):
        pf.load(path)
    path.write_bytes(struct.pack("<Q", 10) + b"\xff" * 10)
    _assert_corrupt(path, "unreadable header")
    path.write_bytes(b"\x05\x00")
    _assert_corrupt(path, "truncated")


# ----------------------------------------------------------------- fuzzing
def _reference():
    """A small real checkpoint of every node kind: its bytes, structure and
    header length."""
    w = pf.nn.Parameter(pf.arange(6.0).reshape(2, 3))
    obj = {"model": {"w": w, "b": pf.ones(2, dtype=pf.bfloat16)},
           "optim": {"state": {0: {"step": pf.tensor(3.0), "m": pf.zeros(2, 3)}},
                     "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": [0]}]},
           "step": 7, "dtype": pf.float16, "np": np.arange(3, dtype=np.int16),
           "scalar": np.float32(2.5), "flags": [True, None, "x"], "tied": w}
    buf = io.BytesIO()
    pf.save(obj, buf)
    raw = buf.getvalue()
    n = struct.unpack("<Q", raw[:8])[0]
    return raw, n, json.loads(raw[8:8 + n])


RAW, HEADER_LEN, HEADER = _reference()
STRUCTURE = json.loads(HEADER["__metadata__"]["pyflow.structure"])
FUZZ = settings(max_examples=120, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _check_outcomes(results, allow_plain=False):
    """Each load returned, or raised load's RuntimeError naming the file (that
    it is corrupt, or that a tensor's device is not here)."""
    for outcome, value in results:
        if outcome == "ok":
            continue
        if allow_plain and outcome is TypeError and "which pyflow cannot hold" in value:
            continue    # the mutation made it a plain safetensors file of a uint16 tensor
        assert outcome is RuntimeError and value.startswith("load: '"), (outcome, value)
        assert CORRUPT in value or "map_location='cpu'" in value, value
    return results


def _structure_of(result):
    """The non-tensor content of a loaded object (tensors as their dtype and shape)."""
    if isinstance(result, dict):
        return {k: _structure_of(v) for k, v in result.items()}
    if isinstance(result, (list, tuple)):
        return type(result)(_structure_of(v) for v in result)
    if isinstance(result, pf.Tensor):
        return ("tensor", result.dtype.name, tuple(result.shape))
    if isinstance(result, np.ndarray):
        return ("ndarray", str(result.dtype), result.shape)
    return result


EXPECTED = _structure_of(pf.load(io.BytesIO(RAW)))


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, len(RAW) - 1), st.integers(0, 255)),
                      min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, len(RAW))))
def test_fuzz_bytes(edits, cut, tmp_path_factory):
    data = bytearray(RAW)
    for pos, byte in edits:
        data[pos] = byte
    data = bytes(data[:cut] if cut is not None else data)
    path = tmp_path_factory.mktemp("fuzz") / "c.ckpt"
    path.write_bytes(data)
    results = _check_outcomes(_load_both(path), allow_plain=True)
    if cut is None and all(pos >= 8 + HEADER_LEN for pos, _ in edits):
        # only tensor bytes changed: loads, with the same structure
        for outcome, value in results:
            assert outcome == "ok", value
            assert _structure_of(value) == EXPECTED


_ENTRY_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2, 1 << 62),
                          st.floats(allow_nan=True), st.text(max_size=6),
                          st.lists(st.integers(-2, 1 << 40), max_size=4),
                          st.sampled_from(["F32", "F64", "BF16", "U16", "I64", "BOOL", "C64"]))


@FUZZ
@given(key=st.sampled_from(sorted(k for k in HEADER if k != "__metadata__")),
       field=st.sampled_from(["dtype", "shape", "data_offsets", "extra"]),
       value=_ENTRY_VALUES)
def test_fuzz_header_entries(key, field, value, tmp_path_factory):
    header = json.loads(json.dumps(HEADER))
    header[key][field] = value
    path = tmp_path_factory.mktemp("fuzz") / "c.ckpt"
    path.write_bytes(_file_bytes(header, RAW[8 + HEADER_LEN:]))
    _check_outcomes(_load_both(path))


NODE_KEYS = ["tensor", "dict", "list", "tuple", "ndarray", "np_scalar", "dtype", "value",
             "type", "requires_grad", "device", "parameter"]
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70), st.floats(),
              st.text(max_size=5),
              st.sampled_from(["w", "model.w", "float32", "bfloat16", "<f4", "V8", "|b1",
                               "<U3", "OrderedDict", "Counter", "cpu", "cuda:0"])),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.sampled_from(NODE_KEYS), inner, max_size=3)),
    max_leaves=12)


def _paths(node, path=()):
    yield path
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, path + (i,))


def _replace(node, path, value):
    if not path:
        return value
    node = json.loads(json.dumps(node))
    parent = node
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = value
    return node


SUBTREES = list(_paths(STRUCTURE))


@FUZZ
@given(where=st.sampled_from(SUBTREES), value=_JSON)
def test_fuzz_structure(where, value, tmp_path_factory):
    import safetensors.numpy
    structure = _replace(STRUCTURE, where, value)
    arrays = safetensors.numpy.load(RAW)
    path = tmp_path_factory.mktemp("fuzz") / "c.ckpt"
    safetensors.numpy.save_file(arrays, str(path), metadata=_meta(json.dumps(structure)))
    _check_outcomes(_load_both(path))


def test_fuzz_reference_is_sane():
    """The fuzzed checkpoint holds every node kind (so the families reach them)."""
    text = json.dumps(STRUCTURE)
    for kind in ('"tensor"', '"dict"', '"list"', '"tuple"', '"ndarray"', '"np_scalar"',
                 '"dtype"', '"parameter"'):
        assert kind in text, kind
    assert len(SUBTREES) > 50 and math.isfinite(EXPECTED["scalar"])
