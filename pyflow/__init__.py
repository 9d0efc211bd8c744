"""pyflow: a deep-learning training framework written entirely in Python.

PyTorch's user interface over numba kernels; see README.md and docs/.
"""
import os as _os

# OpenBLAS workers must sleep, not spin, between GEMMs on a few cores (and
# OpenMP's too where ranks share the machine); the libraries read that from the
# environment once, so it is set before NumPy loads (and a pool that NumPy
# already started is restarted): see _threads.py.
from . import _threads  # noqa: E402
_threads.set_wait_policies()

from . import _malloc  # noqa: E402,F401  (keeps freed tensor memory for reuse; see _malloc.py)
_threads.restart_preloaded_openblas()

# A source checkout keeps kernels/, comm/ and models/ beside pyflow/ (setup.cfg
# installs them as pyflow.kernels, pyflow.comm, pyflow.models); let the same
# import names work from a checkout too.
_here = _os.path.dirname(_os.path.abspath(__file__))
_top = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "kernels")) and \
        _os.path.isfile(_os.path.join(_top, "setup.cfg")):
    __path__.append(_top)

from . import dtypes  # noqa: F401  (pyflow.dtypes: dtype objects and promotion)
from .dtypes import (bfloat16, bool, double, dtype, float, float16, float32, float64,  # noqa: A004
                    get_default_dtype, half, int, int32, int64, long, promote_types,
                    result_type, set_default_dtype)
from .device import device, get_default_device, set_default_device
from .tensor import Size, Tensor
from . import autograd
from .autograd import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .random import Generator, get_rng_state, initial_seed, manual_seed, seed, set_rng_state
from .ops import *  # noqa: F401,F403
from . import ops
from . import backends, cuda, nn, optim, utils
from . import amp  # noqa: E402  (pyflow.amp.GradScaler: dynamic loss scaling)
from .amp import autocast, get_autocast_dtype, is_autocast_enabled  # noqa: E402
from .distributed import env  # noqa: E402  (pyflow.env.get_rank() ...; MPI starts on first use)
from .distributed import placement, sbp  # noqa: E402  (pyflow.placement, pyflow.sbp.split(0) ...)
from .distributed import dispatch, global_tensor  # noqa: E402,F401  (global tensors; fill _hooks)
from .graph.explain import explain
from .utils.serialization import load, save

__version__ = "0.1.0"
