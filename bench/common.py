"""Timing helpers shared by the benchmarks: medians of repeated runs, ratio tables,
one library per child process (RESULT lines), one model file for both libraries."""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time


def median_time(fn, repeats=7, number=1, warmup=2):
    """Median seconds per call of ``fn`` over ``repeats`` timings of ``number`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number)
    return statistics.median(times)


def step_times(step, steps, warmup):
    """Median seconds of ``step()`` over ``steps`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(fns, repeats=7, number=1, warmup=2):
    """Median time of each fn, timing them alternately so machine noise hits all alike."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    samples = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            samples[i].append((time.perf_counter() - t0) / number)
    return [statistics.median(s) for s in samples]


def cpu_model():
    """The CPU's model name (results differ between Intel and AMD machines)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine():
    import numpy
    import torch
    import pyflow
    return (f"{cpu_model()}, {__import__('os').cpu_count()} cores, "
            f"Python {platform.python_version()}, numpy {numpy.__version__}, "
            f"torch {torch.__version__} ({torch.get_num_threads()} threads), pyflow {pyflow.__version__}")


def table(rows, headers):
    widths = [max(len(str(r[i])) for r in rows + [headers]) for i in range(len(headers))]
    line = lambda r: "| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |"
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join(out + [line(r) for r in rows])


# ------------------------------------------------------------------ one library per process
# On a 2-core machine one framework's thread pool (torch's spinning OpenMP workers,
# NumPy's OpenBLAS workers) slows the other's next call in a shared process, and
# pyflow sets OMP_WAIT_POLICY at import, which a torch imported later would read.
# So the benchmarks that compare libraries run each in a fresh child process whose
# parent imports neither, and read back one line: RESULT followed by JSON.
RESULT = "RESULT "
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def emit_result(fn):
    """Run a worker ``fn`` (returning a JSON-able dict) and print its result, or
    its error as ``{"error": ...}``, as one RESULT line on stdout."""
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 (the parent reports it, nothing is hidden)
        out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
    print(RESULT + json.dumps(out), flush=True)


def run_child(argv, env=None, timeout=600, what="worker"):
    """Run ``python *argv`` in a fresh process (cwd: the repository) and return
    the dict of its last RESULT line; ``{"error": ...}`` when it printed none,
    timed out or failed to start."""
    try:
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env,
                              timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"{what} timed out after {timeout} s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if lines:
        return json.loads(lines[-1][len(RESULT):])
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"error": f"{what} exited with status {proc.returncode}: {tail}"[:300]}


def machine_in_child(env=None):
    """``machine()``'s line, computed in a child process so that the caller never
    imports torch or pyflow (an error text if the child fails)."""
    code = ("import sys; sys.path.insert(0, %r); from bench.common import emit_result, machine; "
            "emit_result(lambda: {'machine': machine()})" % ROOT)
    res = run_child(["-c", code], env=env, timeout=300, what="the machine probe")
    return res.get("machine") or res["error"]


def load_with(path, lib, name=None):
    """The module of the file ``path``, written against pyflow, for ``lib``: for
    torch, the same file executed with ``pyflow``, ``pyflow.nn`` and
    ``pyflow.nn.functional`` bound to torch's while it is imported (its globals
    keep pointing at torch), so both libraries run the very same code."""
    import importlib.util
    name = name or f"_bench_{lib.__name__}_{os.path.splitext(os.path.basename(path))[0]}"
    aliases = ({} if lib.__name__ == "pyflow" else
               {"pyflow": lib, "pyflow.nn": lib.nn, "pyflow.nn.functional": lib.nn.functional})
    saved = {k: sys.modules.get(k) for k in aliases}
    sys.modules.update(aliases)
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return module


def make_step(lib, mode, model, inputs, loss_of, opt, executor=None, fuse_update=None):
    """A function running one training step of ``model`` on ``inputs`` and returning
    the loss: eager (zero_grad, forward, backward, step) or, for ``mode ==
    "graph"``, one call of an ``nn.Graph`` with ``add_optimizer`` whose build()
    does the forward and ``loss.backward()`` (``executor``, ``fuse_update``: its
    ``graph.config``; None keeps the default)."""
    if mode == "graph":
        class TrainGraph(lib.nn.Graph):
            def __init__(self):
                super().__init__()
                self.model = model
                self.add_optimizer(opt)
                if executor is not None:
                    self.config.set_executor(executor)
                if fuse_update is not None:
                    self.config.allow_fuse_model_update_ops(fuse_update)

            def build(self, *inputs):
                loss = loss_of(self.model, *inputs)
                loss.backward()
                return loss
        graph = TrainGraph()
        return lambda: graph(*inputs)

    def step():
        opt.zero_grad()
        loss = loss_of(model, *inputs)
        loss.backward()
        opt.step()
        return loss
    return step


def positive(text):
    """argparse type: a positive integer."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {n}")
    return n


def write_section(path, section, text):
    """Put ``text`` (a Markdown section starting with the heading ``section``,
    e.g. ``## Roofline``) into the file ``path``, replacing the one there."""
    old = open(path).read() if os.path.exists(path) else ""
    if section in old:
        head, rest = old.split(section, 1)
        nxt = rest.find("\n## ")
        old = head + (rest[nxt + 1:] if nxt >= 0 else "")
    with open(path, "w") as f:
        f.write(old.rstrip("\n") + "\n\n" + text)
