import os
import sys

os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # see pyflow/__init__.py

# Tests import pyflow from this checkout.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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
