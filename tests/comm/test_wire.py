"""pyflow.comm takes tensors without importing pyflow.tensor (comm sits below the
tensor layer): ``wire.is_tensor`` recognises them, ``wire.new_tensor`` builds
results of the argument's base class, and the gradient buckets allocate through
the device backend.  In-process checks, a world of one."""
import numpy as np
import pytest

import pyflow

pytestmark = pytest.mark.cpu_only   # cpu tensors in this process; the MPI runs are test_comm.py's


@pytest.fixture
def comm():
    import pyflow.comm
    return pyflow.comm


def test_is_tensor_is_true_for_tensors_only(comm):
    from pyflow.comm.wire import is_tensor
    assert is_tensor(pyflow.ones(2)) and is_tensor(pyflow.nn.Parameter(pyflow.ones(2)))
    for other in (np.ones(2), None, 3.0, [1.0], type("Fake", (), {"dtype": np.float32})()):
        assert not is_tensor(other), other


def test_new_tensor_is_of_the_base_class_on_the_arguments_device(comm):
    from pyflow.comm.wire import new_tensor
    p = pyflow.nn.Parameter(pyflow.ones(3))
    t = new_tensor(p, np.arange(3, dtype=np.float32))
    assert type(t) is pyflow.Tensor and t.dtype is pyflow.float32 and t.device == p.device
    assert t.tolist() == [0.0, 1.0, 2.0] and not t.requires_grad and t._version is not p._version
    i = new_tensor(p, np.arange(2, dtype=np.int64), pyflow.int64)
    assert i.dtype is pyflow.int64 and i.tolist() == [0, 1]


def test_collectives_refuse_what_is_not_a_tensor(comm):
    with pytest.raises(TypeError, match="all_gather: tensor must be a pyflow Tensor, got ndarray"):
        comm.all_gather(np.ones(2))
    with pytest.raises(TypeError, match="all_reduce: tensor must be a pyflow Tensor, got list"):
        comm.all_reduce([1.0])
    # all_reduce's direct path too: an object with a NumPy ``_data`` is not a tensor
    fake = type("Fake", (), {"_data": np.ones(2, np.float32), "dtype": np.dtype(np.float32),
                             "_version": [0]})()
    with pytest.raises(TypeError, match="all_reduce: tensor must be a pyflow Tensor, got Fake"):
        comm.all_reduce(fake)


def test_collective_of_a_parameter_returns_a_tensor(comm):
    p = pyflow.nn.Parameter(pyflow.tensor([[1.0, 2.0]]))
    gathered = comm.all_gather(p)
    assert type(gathered) is pyflow.Tensor and gathered.tolist() == [[1.0, 2.0]]
    assert comm.all_reduce(p) is p and p.tolist() == [[1.0, 2.0]]


def test_bucket_buffers_come_from_the_device_backend(comm):
    a = pyflow.nn.Parameter(pyflow.ones(2, 3))
    b = pyflow.nn.Parameter(pyflow.ones(4, dtype=pyflow.float64))
    a.grad = pyflow.full((2, 3), 2.0)
    bucketer = comm.GradBucketer([a, b])
    bucketer.reduce()
    for bucket in bucketer.buckets:
        assert type(bucket.flat) is pyflow.Tensor and bucket.flat.dtype is bucket.dtype
        assert type(bucket.flat._data) is np.ndarray and tuple(bucket.flat.shape) == (bucket.numel,)
    assert a.grad.tolist() == [[2.0] * 3] * 2
    # a parameter without a gradient receives the reduced one (zeros in a world of one)
    assert type(b.grad) is pyflow.Tensor and b.grad.dtype is pyflow.float64
    assert tuple(b.grad.shape) == (4,) and b.grad.tolist() == [0.0] * 4
