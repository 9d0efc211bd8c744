"""Copies between host and device memory (the only kernels that cross devices)."""
from ..registry import register
from ._memory import to_device, to_host


@register("to_device", "cuda")
def host_to_device(host_array):
    return to_device(host_array)


@register("to_host", "cuda")
def device_to_host(device_array):
    return to_host(device_array)
