"""The kernel registry: (op name, device type) -> kernel function.

Ops never import a kernel module directly; they ask ``get(op, device_type)``.
Kernel modules register themselves with ``@register("op", "cpu")``.  A device's
kernel modules are imported on first lookup for that device, so importing
pyflow does not pay for backends it never uses.
"""
import importlib

class KernelNotFound(RuntimeError):
    """An op was asked to run on a device that has no kernel for it."""


_KERNELS = {}
_LOADED = set()
_BACKEND_PACKAGES = {"cpu": "pyflow.kernels.cpu", "cuda": "pyflow.kernels.cuda"}


def register(op, device_type):
    def deco(fn):
        key = (op, device_type)
        if key in _KERNELS:
            raise RuntimeError(f"kernel {op!r} for {device_type!r} registered twice")
        _KERNELS[key] = fn
        return fn
    return deco


def _load(device_type):
    if device_type not in _LOADED:
        pkg = _BACKEND_PACKAGES.get(device_type)
        if pkg is None:
            raise RuntimeError(f"no kernels exist for device type {device_type!r}; "
                               f"known: {sorted(_BACKEND_PACKAGES)}")
        importlib.import_module(pkg).load_all()
        _LOADED.add(device_type)


def get(op, device_type):
    try:
        return _KERNELS[(op, device_type)]
    except KeyError:
        _load(device_type)
        try:
            return _KERNELS[(op, device_type)]
        except KeyError:
            raise KernelNotFound(
                f"op {op!r} has no kernel for device {device_type!r}") from None


def registered(device_type):
    """Names of all ops that have a kernel for ``device_type``."""
    _load(device_type)
    return sorted(op for (op, dev) in _KERNELS if dev == device_type)
