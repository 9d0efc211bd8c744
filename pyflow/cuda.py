"""pyflow.cuda: the CUDA device's public helpers.

This build has no CUDA backend yet (its numba.cuda kernels are a separate
work item), so ``is_available()`` is False and moving a tensor to ``cuda``
raises an error that says so.
"""


def is_available():
    return False


def device_count():
    return 0
