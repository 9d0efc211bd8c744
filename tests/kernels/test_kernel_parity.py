"""Every op has a kernel on every device: an op registered for ``cpu`` without a
``cuda`` kernel (or the other way round) fails here.

Runs in a child process so kernels registered by other tests (the docs page
registers an example op) don't count.
"""
import json
import subprocess
import sys

# Transfers between host and device exist only on the device side by nature.
DEVICE_ONLY = {"to_device", "to_host"}

SCRIPT = """
import json
from pyflow.kernels import registry
print(json.dumps({"cpu": registry.registered("cpu"), "cuda": registry.registered("cuda")}))
"""


def test_cpu_and_cuda_register_the_same_ops():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         check=True).stdout
    ops = json.loads(out.strip().splitlines()[-1])
    cpu, cuda = set(ops["cpu"]), set(ops["cuda"]) - DEVICE_ONLY
    assert not cpu - cuda, f"ops with a cpu kernel but no cuda kernel: {sorted(cpu - cuda)}"
    assert not cuda - cpu, f"ops with a cuda kernel but no cpu kernel: {sorted(cuda - cpu)}"
