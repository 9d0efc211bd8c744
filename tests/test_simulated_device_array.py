"""The simulator's device arrays are as strict as CuPy (kernels/cuda/_simarray.py).

The checks need NUMBA_ENABLE_CUDASIM=1 before numba is imported, so this file
is also the simulator script: the test runs it in a child process
(``cudatools.run_in_simulator``), where ``__main__`` runs every check and
prints ``N checks, F failures``.
"""
import os
import pickle
import sys

import numpy as np
import pytest
from numba import cuda

HERE = os.path.dirname(os.path.abspath(__file__))


def test_simulated_device_arrays_are_strict():
    from tests.kernels.cudatools import run_in_simulator
    run_in_simulator(os.path.abspath(__file__))


def test_cpu_storage_check_accepts_host_arrays():
    import pyflow as pf
    from pyflow.tensor import Tensor
    t = Tensor._make(np.float64(2.0), pf.float64)       # a 0-d CPU result stays allowed
    assert t.item() == 2.0
    assert Tensor._make(np.arange(3.0), pf.float64).tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(RuntimeError, match="internal error.*cpu"):
        Tensor._make([1.0, 2.0], pf.float64)


# ----------------------------------------------------------------------------- child process
def raises(exc, fn, match):
    try:
        fn()
    except exc as e:
        assert match in str(e), f"{match!r} not in {e}"
        return
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def _double(x, y):
    """A simulated kernel (module level: the simulator swaps this module's ``cuda``)."""
    i = cuda.grid(1)
    if i < x.size:
        y[i] = 2 * x[i]


def main():
    sys.path.insert(0, os.path.dirname(HERE))
    import numba

    from tests.kernels.cudatools import Checks
    check = Checks()

    import pyflow as pf
    from pyflow.kernels.cuda import _memory
    from pyflow.kernels.cuda._simarray import SimulatedDeviceArray
    from pyflow.kernels.registry import get as kernel
    from pyflow.tensor import Tensor

    assert _memory.simulated()
    dev = _memory.zeros((2, 3), np.float64)
    host = np.ones((2, 3))

    @check("memory helpers make device arrays")
    def _():
        assert type(dev) is SimulatedDeviceArray
        assert type(_memory.empty(4, np.float32)) is SimulatedDeviceArray
        assert type(_memory.to_device(host)) is SimulatedDeviceArray
        back = _memory.to_host(_memory.to_device(host))
        assert type(back) is np.ndarray and np.array_equal(back, host)
        assert _memory.array_module(dev) is not np and _memory.array_module(host) is np

    @check("device arrays mix with scalars and 0-d arrays, staying on the device")
    def _():
        for r in (dev + 1, dev * np.float32(2), dev + np.array(3.0), np.sqrt(dev), dev.sum(),
                  np.where(dev > 0, dev, 0.0), np.concatenate([dev, dev]), dev.max(axis=0),
                  dev.astype(np.float32), _memory.array_module(dev).zeros(3)):
            assert type(r) is SimulatedDeviceArray, type(r)
        assert float(dev.sum()) == 0.0 and not bool(dev.max() > 0)

    @check("mixing a host array with a device array raises TypeError (as CuPy does)")
    def _():
        raises(TypeError, lambda: dev + host, "host NumPy array")
        raises(TypeError, lambda: np.where(dev > 0, host, dev), "numpy.where")
        raises(TypeError, lambda: np.concatenate([dev, host]), "numpy.concatenate")
        raises(TypeError, lambda: np.add(dev, 1, out=np.empty((2, 3))), "numpy.add")
        raises(TypeError, lambda: pickle.dumps(dev), "cannot be pickled")

    @check("a CPU numba function refuses a device array")
    def _():
        @numba.njit
        def total(a):
            return a.sum()
        assert total(host) == 6.0
        raises(TypeError, lambda: total(dev), "CPU numba function")
        src3, idx3 = _memory.zeros((1, 2, 1), np.float64), _memory.zeros((1, 2, 1), np.int64)
        raises(TypeError, lambda: kernel("gather", "cpu")(src3, idx3), "cuda device array")

    @check("simulated CUDA kernels take device arrays")
    def _():
        double = cuda.jit(_double)
        x = _memory.to_device(np.arange(4.0))
        y = _memory.empty(4, np.float64)
        double[1, 4, _memory.stream()](x, y)
        assert type(y) is SimulatedDeviceArray and y.tolist() == [0.0, 2.0, 4.0, 6.0]

    @check("Tensor._make refuses host storage on cuda and device storage on cpu")
    def _():
        cuda0 = pf.device("cuda", 0)
        raises(RuntimeError, lambda: Tensor._make(np.zeros(3, np.float32), pf.float32, cuda0),
               "internal error: a pyflow.float32 tensor on device 'cuda:0'")
        raises(RuntimeError, lambda: Tensor._make(_memory.zeros(3, np.float32), pf.float32),
               "on device 'cpu' must hold a host numpy.ndarray")
        assert type(pf.ones(3, device="cuda")._data) is SimulatedDeviceArray

    def on_both(fn, *arrays, **kw):
        """fn on cpu tensors and on cuda tensors: the cuda results hold device
        storage and equal the cpu ones."""
        cpu = fn(*[pf.tensor(a, **kw) for a in arrays])
        gpu = fn(*[pf.tensor(a, device="cuda", **kw) for a in arrays])
        cpu = cpu if isinstance(cpu, (tuple, list)) else (cpu,)
        gpu = gpu if isinstance(gpu, (tuple, list)) else (gpu,)
        for c, g in zip(cpu, gpu):
            assert g.device.type == "cuda" and type(g._data) is SimulatedDeviceArray, type(g._data)
            np.testing.assert_allclose(g.cpu().numpy(), c.numpy(), rtol=1e-6, atol=1e-9)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 4))

    def grad_of(fn):
        def run(t):
            t.requires_grad_()
            fn(t).square().sum().backward()
            return t.grad
        return run

    ops = {
        "clone": lambda t: t.clone(),
        "std (full)": lambda t: t.std(),
        "sum backward of a slice": grad_of(lambda t: t[1:, ::2]),
        "advanced index and its backward": grad_of(lambda t: t[[0, 2, 2], 1:]),
        "bool mask index": grad_of(lambda t: t[t > 0]),
        "setitem with a list key": lambda t: t.clone().index_put_((pf.tensor([0, 2]),),
                                                                    pf.tensor(1.0, device=t.device)),
        "gather backward": grad_of(lambda t: t.gather(1, pf.tensor([[0, 3], [1, 1], [2, 0]],
                                                                  device=t.device))),
        "scatter_add": lambda t: t.scatter_add(0, pf.tensor([[0, 1, 2, 0]], device=t.device),
                                               t[:1]),
        "index_add": lambda t: t.index_add(0, pf.tensor([2, 0], device=t.device), t[:2]),
        "isclose": lambda t: pf.isclose(t, t + 1e-9),
        "nonzero": lambda t: (t > 0).nonzero(),
        "masked_select": lambda t: t.masked_select(t > 0),
        "reflect pad": lambda t: pf.nn.functional.pad(t[None], (2, 1), mode="reflect"),
        "causal attention": lambda t: pf.nn.functional.scaled_dot_product_attention(
            t, t, t, is_causal=True),
        "cross_entropy (grad-enabled backward)": grad_of(lambda t: pf.cross_entropy(
            t, pf.tensor([0, 3, 1], device=t.device), weight=pf.tensor(
                [1.0, 2.0, 0.5, 1.5], dtype=t.dtype, device=t.device), label_smoothing=0.1,
            reduction="none")),
        "binary_cross_entropy_with_logits": lambda t: pf.nn.functional.
        binary_cross_entropy_with_logits(t, t.sigmoid()),
        "embedding with max_norm": lambda t: pf.embedding(
            pf.tensor([[0, 2], [2, 1]], device=t.device), t.clone(), max_norm=1.0),
    }
    for name, fn in ops.items():
        check(f"op on cuda keeps device storage: {name}")(lambda fn=fn: on_both(fn, x))

    @check("batch_norm training updates running stats on the device")
    def _():
        xs = rng.standard_normal((4, 3, 2))
        stats = {}
        for device in ("cpu", "cuda"):
            rm, rv = pf.zeros(3, device=device), pf.ones(3, device=device)
            out = pf.nn.functional.batch_norm(pf.tensor(xs, dtype=pf.float32, device=device),
                                              rm, rv, training=True)
            stats[device] = (type(rm._data), type(out._data), rm.cpu().numpy())
        assert stats["cuda"][:2] == (SimulatedDeviceArray, SimulatedDeviceArray)
        np.testing.assert_allclose(stats["cuda"][2], stats["cpu"][2], rtol=1e-6)

    @check("a cuda tensor pickles as a host copy and unpickles on cuda")
    def _():
        t = pf.tensor(x, device="cuda", requires_grad=True)
        u = pickle.loads(pickle.dumps(t))
        assert u.device.type == "cuda" and u.requires_grad and type(u._data) is SimulatedDeviceArray
        np.testing.assert_array_equal(u.detach().cpu().numpy(), x)

    return check.report()


if __name__ == "__main__":
    sys.exit(main())
