"""Every op has a kernel on every device: an op registered for ``cpu`` without a
``cuda`` kernel (or the other way round) fails here, naming the module that
registers the one it has and the module where the other belongs.

The ops are the registry's own (``registry.registered``, which imports every
kernel module), so a new op is checked without a list to edit.  Runs in a
child process so kernels registered by other tests (the docs page registers an
example op) don't count.
"""
import json
import subprocess
import sys

# Transfers between host and device exist only on the device side by nature.
DEVICE_ONLY = {"to_device", "to_host"}
# The fused attention kernels are the CPU's only (kernels/cpu/attention.py): the
# op raises a clear error on other devices, and the graph pass and
# scaled_dot_product_attention use it on the CPU alone; everywhere else the
# matmul/softmax chain runs, whose kernels have their cuda twins.
CPU_ONLY = {"attention_forward", "attention_backward"}

SCRIPT = """
import json
from pyflow.kernels import registry
print(json.dumps({dev: {op: registry.get(op, dev).__module__ for op in registry.registered(dev)}
                  for dev in ("cpu", "cuda")}))
"""


def _file(module):
    """``pyflow.kernels.cpu.softmax`` -> ``kernels/cpu/softmax.py``."""
    return module.removeprefix("pyflow.").replace(".", "/") + ".py"


def missing_twins(ops):
    """One line per op whose kernel exists on one device only, saying where to add the other."""
    lines = []
    for have, lack in (("cpu", "cuda"), ("cuda", "cpu")):
        for op in sorted(set(ops[have]) - set(ops[lack]) - DEVICE_ONLY
                         - (CPU_ONLY if have == "cpu" else set())):
            module = ops[have][op]
            family = module.rsplit(".", 1)[1]
            how = "numba.cuda, docs/custom_op.md step 2" if lack == "cuda" else \
                "@njit, docs/custom_op.md step 1"
            lines.append(f"op {op!r} has a {have} kernel ({_file(module)}) but no {lack} "
                         f"kernel: add @register({op!r}, {lack!r}) in "
                         f"kernels/{lack}/{family}.py ({how})")
    return lines


def test_cpu_and_cuda_register_the_same_ops():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                         check=True).stdout
    ops = json.loads(out.strip().splitlines()[-1])
    assert len(ops["cpu"]) > 50, f"the registry lists only {len(ops['cpu'])} cpu kernels"
    missing = missing_twins(ops)
    assert not missing, "\n".join(missing)


def test_the_message_says_where_to_add_the_twin():
    ops = {"cpu": {"softplus": "pyflow.kernels.cpu.activation", "add": "x"},
           "cuda": {"add": "y", "to_host": "pyflow.kernels.cuda.transfer",
                    "erfinv": "pyflow.kernels.cuda.elementwise"}}
    assert missing_twins(ops) == [
        "op 'softplus' has a cpu kernel (kernels/cpu/activation.py) but no cuda kernel: add "
        "@register('softplus', 'cuda') in kernels/cuda/activation.py (numba.cuda, "
        "docs/custom_op.md step 2)",
        "op 'erfinv' has a cuda kernel (kernels/cuda/elementwise.py) but no cpu kernel: add "
        "@register('erfinv', 'cpu') in kernels/cpu/elementwise.py (@njit, docs/custom_op.md "
        "step 1)"]
