import os
import sys

# Two pytest-xdist workers share 2 cores here: idle OpenBLAS threads sleep at once
# (pyflow's default spins ~0.3 ms for one process alone; pyflow/_threads.py).
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

# Matrix products follow blas.py's fixed size rule (PYFLOW_BLAS=mkl where the mkl
# wheel is installed, numpy otherwise), not a measurement of the machine: results do
# not depend on timing and no test process spends ~1.2 s measuring.
# tests/kernels/test_blas_tuning.py tests PYFLOW_BLAS=auto with a cache of its own.
import importlib.metadata as _metadata  # noqa: E402

try:
    _metadata.version("mkl")
    os.environ.setdefault("PYFLOW_BLAS", "mkl")
except _metadata.PackageNotFoundError:
    os.environ.setdefault("PYFLOW_BLAS", "numpy")

# Tests import pyflow from this checkout.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Without Open MPI's ofi BTL, importing pyflow (mpi4py's MPI_Init) takes ~0.2 s
# instead of ~1.3 s, here and in every process the tests start (tests/mpi_env.py).
from tests.mpi_env import FAST_MPI_INIT  # noqa: E402

for _key, _value in FAST_MPI_INIT.items():
    os.environ.setdefault(_key, _value)

from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile("ci", max_examples=25, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=10, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("sim", max_examples=3, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# PYFLOW_TEST_DEVICE=cuda (with NUMBA_ENABLE_CUDASIM=1 and no GPU) runs the op
# tests again with every tensor created on the cuda device.
if os.environ.get("PYFLOW_TEST_DEVICE"):
    import pyflow  # noqa: E402
    pyflow.set_default_device(os.environ["PYFLOW_TEST_DEVICE"])


def pytest_collection_modifyitems(items):
    """Tests marked ``slow`` (simulator scripts and MPI jobs of half a minute to two
    minutes) run first, the rest in their usual order.  pytest-xdist's workers then
    end the run on short tests, instead of one worker running a two-minute test
    alone while the other waits."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
