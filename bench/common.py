"""Timing helpers shared by the benchmarks: medians of repeated runs, ratio tables."""
import platform
import statistics
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
