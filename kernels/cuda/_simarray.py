"""The simulator's strict device arrays, under the name kernels and tests import.

The class and its stand-in for the ``cupy`` module live in ``pyflow/_simarray.py``,
at the device level: the simulated cuda backend (``pyflow/device.py``), which
sits below ``kernels/``, makes these arrays and recognises them.  This module
only re-exports them, so the older import path keeps working.
"""
from pyflow._simarray import SIM_NUMPY, SimulatedDeviceArray, as_simulated, is_simulated_array

__all__ = ["SimulatedDeviceArray", "SIM_NUMPY", "as_simulated", "is_simulated_array"]
