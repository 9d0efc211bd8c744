"""A new op is checked without editing a list: these tests find it themselves
and say what it lacks and where to add it (the trail is docs/custom_op.md).

* SBP: every autograd ``Function`` of pyflow (found by walking the subclasses
  after importing every op module and graph pass) declares an ``sbp_rule``, or
  is in ``REPLICATED`` below with the reason it runs on replicated inputs.
* PTX: every CUDA kernel written in ``kernels/cuda/*.py`` (found in the source
  by ``cudatools.kernel_bodies``) is one that a PTX test compiles for sm_80 and
  sm_90 (each ``tests/kernels/test_cuda_*ptx*.py`` says which functions it
  compiles through ``ptx_kernels()``; a module's ``kernel_specs()`` is
  compiled by test_cuda_rows_ptx.py).  Nothing is compiled here.
* Registry (cpu and cuda kernels for every op): tests/kernels/test_kernel_parity.py.
"""
import importlib
import os
import pathlib
import pkgutil

import pyflow
import pyflow.graph.passes
import pyflow.ops
from pyflow.autograd import Function
from pyflow.distributed import signatures
from tests.kernels import cudatools

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Functions that run on replicated inputs on purpose (no sbp_rule), each with why.
# "not declared yet" means a rule could do better and nobody has written it.
_CONV_GRAD = "conv2d's gradient as an op: split together with Conv2d when it gets a rule"
_POOL_GRAD = "pooling's gradient as an op: split together with the pooling ops"
_INDEXED = ("reads or writes the positions an index tensor names, anywhere along the "
            "indexed dim; splits of the other dims not declared yet")
REPLICATED = {
    "ops.conv.Conv2d": "not split yet (a batch split of x with w, b broadcast would be local)",
    "ops.conv.Conv2dInputGrad": _CONV_GRAD,
    "ops.conv.Conv2dWeightGrad": _CONV_GRAD,
    "ops.conv.MaxPool2d": "not split yet (batch and channel splits would be local)",
    "ops.conv.AvgPool2d": "not split yet (batch and channel splits would be local)",
    "ops.conv.PoolScatter": _POOL_GRAD,
    "ops.conv.PoolGather": _POOL_GRAD,
    "ops.conv.AvgPool2dBackward": _POOL_GRAD,
    "ops.embedding.EmbeddingBackward": "embedding's gradient as an op (double backward): "
                                       "scatter-adds rows into the whole table",
    "ops.index.Gather": _INDEXED,
    "ops.index.ScatterAdd": _INDEXED,
    "ops.index.IndexSelect": _INDEXED,
    "ops.index.IndexAdd": _INDEXED,
    "ops.indexing.Index": _INDEXED,
    "ops.indexing.IndexAccumulate": _INDEXED,
    "ops.indexing.IndexPut": _INDEXED,
    "ops.join.Tril": "the mask depends on each element's global row and column, which a "
                     "split piece does not know",
    "ops.join.Triu": "the mask depends on each element's global row and column, which a "
                     "split piece does not know",
    "ops.join.PadConstant": "padding a split dim would change only the end pieces; other "
                            "dims not declared yet",
    "ops.join.Repeat": "tiles the whole tensor; not declared yet",
    "ops.join.Flip": "flipping a split dim reverses the order of the pieces; other dims "
                     "not declared yet",
    "ops.join.Roll": "rolling a split dim moves elements between pieces; other dims not "
                     "declared yet",
    "ops.loss.TargetWeightSum": "a loss's 'mean' denominator: one float64 count over all "
                                "targets, computed on the host",
    "ops.loss.NLLLossBackward": "nll_loss's gradient as an op (double backward); not split yet",
    "ops.loss.BCEWithLogits": "elementwise, but not declared yet (elementwise_rule() would fit)",
    "ops.normalization.BatchNorm": "per-channel statistics over the batch: a batch split "
                                   "needs their all-reduce (SyncBatchNorm), not written",
    "ops.normalization.BatchNormStats": "per-channel statistics over the batch: a batch split "
                                        "needs their all-reduce (SyncBatchNorm), not written",
    "ops.normalization.RunningAverage": "updates a running-statistics buffer from the batch "
                                        "statistics, in float64",
    "ops.reduce.Prod": "a product over a split dim is not a partial sum; kept-dim splits "
                       "not declared yet",
    "ops.reduce.MaxDim": "indices over a split dim would need each piece's offset; kept-dim "
                         "splits not declared yet",
    "ops.reduce.MinDim": "indices over a split dim would need each piece's offset; kept-dim "
                         "splits not declared yet",
    "ops.reduce.VarStd": "a variance over a split dim is not a sum of the pieces' "
                         "variances; kept-dim splits not declared yet",
    "ops.reduce.Norm": "a p-norm over a split dim is not a sum of the pieces' norms; "
                       "kept-dim splits not declared yet",
    "ops.reduce.LogSumExp": "kept-dim splits would be local; not declared yet",
    "ops.reduce.CumSum": "a scan along a split dim needs the earlier pieces' totals; other "
                         "dims not declared yet",
    "ops.reduce.ReverseCumSum": "a scan along a split dim needs the later pieces' totals; "
                                "other dims not declared yet",
    "ops.shape.SliceScatter": "a slice's gradient as an op: zeros of the whole shape with "
                              "the gradient written at the slice's global key",
    "ops.transfer.ToDevice": "a copy between devices; a global tensor changes device with "
                             "to_global(placement)",
}


# ------------------------------------------------------------------ SBP coverage
def _import_all(package):
    for info in pkgutil.iter_modules(package.__path__):
        importlib.import_module(f"{package.__name__}.{info.name}")


def _key(cls):
    return f"{cls.__module__.removeprefix('pyflow.')}.{cls.__qualname__}"


def pyflow_functions():
    """Every Function subclass pyflow defines (dynamic ones included: the unary
    ops are made with ``type()``), by ``_key``.  A private base class
    (``_MaxMin``, ``_Scan``...) with subclasses is left out: only its
    subclasses are applied, and they inherit its rule."""
    _import_all(pyflow.ops)
    _import_all(pyflow.graph.passes)
    found, stack = {}, [Function]
    while stack:
        for sub in stack.pop().__subclasses__():
            stack.append(sub)
            abstract = sub.__name__.startswith("_") and sub.__subclasses__()
            if sub.__module__.startswith("pyflow.") and not abstract:
                found[_key(sub)] = sub
    return found


def _source(cls):
    return cls.__module__.replace(".", "/") + ".py"


def test_every_op_declares_an_sbp_rule_or_says_why_not():
    functions = pyflow_functions()
    missing = []
    for key, cls in sorted(functions.items()):
        if cls.handles_global or key in REPLICATED:
            continue        # handles_global: boxing and to_global/to_local themselves
        if getattr(cls, "sbp_rule", None) is None:
            missing.append(
                f"{_source(cls)}: {cls.__name__} has no sbp_rule, so on global tensors it "
                f"runs replicated (every input boxed to broadcast first).  Declare one in "
                f"the class beside forward and backward, e.g. `sbp_rule = elementwise_rule()` "
                f"for an elementwise op (builders in pyflow/distributed/signatures.py; "
                f"docs/custom_op.md step 3).  If replicated is right for it, add "
                f"{key!r}: '<why>' to REPLICATED in tests/test_op_coverage.py.")
    assert not missing, "\n".join(missing)


def test_the_replicated_table_is_current():
    functions = pyflow_functions()
    stale = [f"{key}: no such Function (renamed or removed?): drop it from REPLICATED in "
             f"tests/test_op_coverage.py" for key in REPLICATED if key not in functions]
    stale += [f"{key}: now declares an sbp_rule: drop it from REPLICATED in "
              f"tests/test_op_coverage.py" for key in REPLICATED
              if key in functions and getattr(functions[key], "sbp_rule", None) is not None]
    assert not stale, "\n".join(stale)
    assert all(len(why) > 20 for why in REPLICATED.values())


def test_rules_are_found():
    """The walk reaches the families, dynamic classes and graph passes (so a
    pass of the test above is not a walk that found nothing)."""
    functions = pyflow_functions()
    assert functions["ops.linalg.Matmul"].sbp_rule is signatures.matmul_rule
    assert signatures.rule_for(functions["ops.elementwise.Neg"]) is signatures.unary_linear_rule
    assert "ops.fused.FusedElementwise" in functions
    assert signatures.rule_for(functions["ops.conv.Conv2d"]) is signatures.broadcast_only
    assert len(functions) > 80


# ------------------------------------------------------------------ PTX coverage
def _ptx_test_modules():
    """The tests/kernels PTX test modules that report what they compile."""
    found = []
    for path in sorted((ROOT / "tests" / "kernels").glob("test_cuda_*ptx*.py")):
        module = importlib.import_module(f"tests.kernels.{path.stem}")
        if hasattr(module, "ptx_kernels"):
            found.append(module)
    return found


def _compiled():
    """{(source file, first line): PTX test file} of every kernel function a PTX test compiles."""
    compiled = {}
    for module in _ptx_test_modules():
        for fn in module.ptx_kernels():
            code = fn.__code__
            compiled[(os.path.realpath(code.co_filename), code.co_firstlineno)] = \
                os.path.relpath(module.__file__, ROOT)
    return compiled


def test_every_cuda_kernel_is_compiled_to_ptx():
    compiled = _compiled()
    missing, count = [], 0
    for name, path in sorted(cudatools.cuda_kernel_modules().items()):
        real = os.path.realpath(path)
        others = sorted({test for (file, _), test in compiled.items() if file == real})
        for kernel, line in cudatools.kernel_bodies(path):
            count += 1
            if (real, line) in compiled:
                continue
            where = (f" (this module's other kernels are compiled by {', '.join(others)}: "
                     f"adding it to that file's specs works too)" if others else "")
            missing.append(
                f"{os.path.relpath(path, ROOT)}:{line} {kernel}: a CUDA kernel that no PTX "
                f"test compiles for sm_80/sm_90.  List it in kernel_specs() of "
                f"kernels/cuda/{name}.py as (label, the plain function (not cuda.jit-ed), "
                f"its numba signature); tests/kernels/test_cuda_rows_ptx.py compiles every "
                f"module's kernel_specs(){where}.")
    assert not missing, "\n".join(missing)
    assert count > 60, f"found only {count} CUDA kernels in kernels/cuda: is discovery broken?"


def test_kernel_discovery_tells_kernels_from_device_functions(tmp_path):
    source = tmp_path / "new_family.py"
    source.write_text(
        "from numba import cuda\n"
        "def block_sum(v, sh):                      # a device function: returns\n"
        "    sh[cuda.threadIdx.x] = v\n"
        "    return sh[0]\n"
        "def factory(dtype):\n"
        "    def scaled(out, x):                     # a kernel made by a factory\n"
        "        i = cuda.grid(1)\n"
        "        if i >= out.size:\n"
        "            return\n"
        "        out[i] = x[i] * 2\n"
        "    return scaled\n"
        "def host(x):                               # host code\n"
        "    return x\n")
    assert cudatools.kernel_bodies(source) == [("scaled", 6)]


def test_the_missing_kernel_message_names_the_file(monkeypatch):
    """A kernel in a module no PTX test knows fails, naming where it is and where to add it."""
    real = cudatools.cuda_kernel_modules
    softmax_path = real()["softmax"]
    monkeypatch.setattr(cudatools, "cuda_kernel_modules",
                        lambda: {**real(), "softmax": softmax_path})
    monkeypatch.setattr(cudatools, "kernel_bodies",
                        lambda path: [("new_kernel", 1)] if path == softmax_path else [])
    try:
        test_every_cuda_kernel_is_compiled_to_ptx()
    except AssertionError as e:
        message = str(e)
    else:
        raise AssertionError("an uncompiled kernel passed")
    assert "kernels/cuda/softmax.py:1 new_kernel" in message
    assert "kernel_specs() of kernels/cuda/softmax.py" in message
    assert "test_cuda_rows_ptx.py" in message


# ------------------------------------------------------------------ the trail runs on a GPU
SIMULATED_PAGE = """
import re, sys
import numpy as np
sys.path.insert(0, {root!r})
page = open({page!r}).read()
namespace = {{"__name__": "docs_custom_op"}}
for i, block in enumerate(re.findall(r"```python\\n(.*?)```", page, flags=re.S)):
    if "compile_ptx_all(" not in block:       # the simulator's numba.cuda has no PTX compiler
        exec(compile(block, f"custom_op.md[block {{i}}]", "exec"), namespace)
import pyflow
softplus = namespace["softplus"]
x = np.random.default_rng(1).uniform(-40, 40, (6, 5)).astype(np.float32)
failures = 0
for transposed in (False, True):             # contiguous, then a strided view
    t = pyflow.tensor(x, device="cuda", requires_grad=True)
    y = softplus(t.t() if transposed else t)
    assert y.device.type == "cuda" and y.dtype is pyflow.float32
    want = np.logaddexp(0, (x.T if transposed else x).astype(np.float64))
    failures += not np.allclose(y.detach().cpu().numpy(), want, rtol=1e-6)
    y.sum().backward()
    failures += not np.allclose(t.grad.cpu().numpy(), 1 / (1 + np.exp(-x)), rtol=1e-5)
print(f"4 checks, {{failures}} failures")
"""


def test_the_custom_op_page_runs_on_the_simulated_gpu(tmp_path):
    """docs/custom_op.md's CUDA kernel really launches (the page's own blocks run
    in the CPU test process, where it can only be compiled)."""
    script = tmp_path / "custom_op_cuda.py"
    script.write_text(SIMULATED_PAGE.format(root=str(ROOT),
                                            page=str(ROOT / "docs" / "custom_op.md")))
    out = cudatools.run_in_simulator(str(script))
    assert "4 checks, 0 failures" in out, out
