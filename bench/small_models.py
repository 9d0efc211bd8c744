"""Training steps of small models written the ordinary PyTorch way: PyTorch
eager, pyflow eager and pyflow graph (``nn.Graph``), samples/s and ratios.

Models (bench/small_model_defs.py, one file run by both libraries):

- ``gpt``: nanoGPT style, 2 layers, d_model 64, 4 heads, T=32, vocabulary 256,
  batch 8; AdamW as nanoGPT configures it (weight decay 0.1 on matrices and
  embeddings only, betas (0.9, 0.95), lr 6e-4).
- ``cnn``: the classic PyTorch MNIST example CNN at batch 64 on 28x28 inputs,
  ``log_softmax`` + ``nll_loss``.  The example trains with Adadelta, which
  pyflow lacks; this uses SGD lr 0.01 momentum 0.5, the example's optimizer
  before it moved to Adadelta.
- ``resnet``: ResNet-18 (torchvision's BasicBlock, batch norm) with a CIFAR
  stem, 32x32 inputs, 10 classes, batch 16; SGD lr 0.01 momentum 0.9 weight
  decay 5e-4.

Synthetic data (random inputs and labels), fixed seeds.  A step is
``zero_grad``, forward, ``backward``, ``step`` in eager mode; in graph mode an
``nn.Graph`` with ``add_optimizer`` whose ``build()`` does the forward and
``loss.backward()`` and returns the loss.  Each run is its own child process
(bench/common.py says why; this parent imports neither library), the three
modes alternating for ``--rounds`` rounds (their order rotating each round):
``--warmup`` steps skipped (graph compilation among them), then ``--steps``
steps timed one by one; a run's samples/s is the batch over its median step
time, and the table shows the median over rounds (range in parentheses).

Targets (issue 16): pyflow graph at least 1.3x PyTorch eager and at least
1.5x pyflow eager on the GPT and the CNN; pyflow eager at least 0.8x PyTorch
eager on all three.

    python bench/small_models.py                        # all three, 3 rounds
    python bench/small_models.py --models gpt cnn --rounds 1 --out /tmp/small.md
"""
import argparse
import dataclasses
import datetime
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import (emit_result, load_with, machine_in_child, make_step, positive,  # noqa
                          run_child, table)

ENV_AT_START = dict(os.environ)        # what every child inherits: nobody imported pyflow yet
DEFS = os.path.join(ROOT, "bench", "small_model_defs.py")
MODES = ("torch", "eager", "graph")    # torch = PyTorch eager; eager/graph = pyflow's


@dataclasses.dataclass(frozen=True)
class Case:
    label: str
    batch: int
    steps: int            # default timed steps (each model's step differs ~100x in cost)
    warmup: int
    graph_targets: bool   # whether the graph-mode targets apply


CASES = {
    "gpt": Case("GPT 2 layers, d=64, 4 heads, T=32, vocab 256 (AdamW)", 8, 30, 5, True),
    "cnn": Case("MNIST example CNN, 28x28 (SGD momentum)", 64, 6, 2, True),
    "resnet": Case("ResNet-18, 32x32, 10 classes (SGD momentum)", 16, 3, 1, False),
}
GRAPH_VS_TORCH, GRAPH_VS_EAGER, EAGER_VS_TORCH = 1.3, 1.5, 0.8


# ------------------------------------------------------------------ the child
def build(lib, model_name):
    """(model, inputs, loss_of(model, *inputs), optimizer) for ``lib``, seeded."""
    import numpy as np
    defs = load_with(DEFS, lib)
    F = lib.nn.functional
    lib.manual_seed(0)
    rng = np.random.default_rng(0)
    batch = CASES[model_name].batch
    if model_name == "gpt":
        model = defs.GPT(vocab_size=256, block_size=32, n_layer=2, n_head=4, n_embd=64)
        inputs = (lib.tensor(rng.integers(0, 256, (batch, 32))),
                  lib.tensor(rng.integers(0, 256, (batch, 32))))

        def loss_of(model, idx, targets):
            return model(idx, targets)[1]
        # nanoGPT's configure_optimizers: decay the 2-D parameters only
        params = list(model.parameters())
        opt = lib.optim.AdamW([{"params": [p for p in params if p.dim() >= 2],
                                "weight_decay": 0.1},
                               {"params": [p for p in params if p.dim() < 2],
                                "weight_decay": 0.0}], lr=6e-4, betas=(0.9, 0.95))
    elif model_name == "cnn":
        model = defs.Net()
        inputs = (lib.tensor(rng.standard_normal((batch, 1, 28, 28)).astype(np.float32)),
                  lib.tensor(rng.integers(0, 10, batch)))

        def loss_of(model, data, target):
            return F.nll_loss(model(data), target)
        opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    elif model_name == "resnet":
        model = defs.resnet18(num_classes=10)
        inputs = (lib.tensor(rng.standard_normal((batch, 3, 32, 32)).astype(np.float32)),
                  lib.tensor(rng.integers(0, 10, batch)))

        def loss_of(model, x, y):
            return F.cross_entropy(model(x), y)
        opt = lib.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    else:
        raise ValueError(f"small_models: unknown model {model_name!r}, expected one of "
                         f"{', '.join(CASES)}")
    model.train()
    return model, inputs, loss_of, opt


def worker(mode, model_name, steps, warmup):
    """Train ``warmup`` + ``steps`` steps in this process; time each of the last ``steps``."""
    if mode == "torch":
        import torch as lib
    else:
        import pyflow as lib    # first: it sets NumPy's BLAS thread timeout (pyflow/__init__.py)
    step = make_step(lib, mode, *build(lib, model_name))
    t0 = time.perf_counter()
    for _ in range(warmup):
        loss = step()
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t)
    last = float(loss.item())
    if last != last:
        raise FloatingPointError(f"{mode} {model_name}: the loss is NaN after {warmup + steps} "
                                 "steps; timings of NaN arithmetic would mislead")
    return {"step_s": times, "median_s": statistics.median(times), "warmup_s": warm_s,
            "loss": last}


# ------------------------------------------------------------------ the parent
def _summary(results, batch):
    """Median samples/s over the runs that worked, their range, the first error."""
    rates = [batch / r["median_s"] for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    if not rates:
        return {"error": errors[0] if errors else "not run"}
    return {"median": statistics.median(rates), "low": min(rates), "high": max(rates),
            "runs": len(rates), "failed": len(errors), "error": errors[0] if errors else None}


def thread_env(threads):
    """The children's environment: as this process started, and with ``threads``
    (when given) every thread pool of either library limited to that many."""
    env = dict(ENV_AT_START)
    if threads:
        env.update({k: str(threads) for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS",
                                              "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")})
    return env


def measure(models, rounds, steps=None, warmup=None, timeout=900, threads=None, log=print):
    """{model: {mode: summary}}; each run a child process, the modes alternating."""
    out = {}
    for name in models:
        case = CASES[name]
        n_steps, n_warm = steps or case.steps, warmup or case.warmup
        raw = {m: [] for m in MODES}
        for r in range(rounds):
            for mode in MODES[r % 3:] + MODES[:r % 3]:
                res = run_child([os.path.abspath(__file__), "--worker", mode, "--model", name,
                                 "--steps", str(n_steps), "--warmup", str(n_warm)],
                                env=thread_env(threads), timeout=timeout,
                                what=f"the {mode} worker")
                raw[mode].append(res)
                log(f"  {name:6s} round {r + 1}/{rounds} {mode:5s}: " +
                    (res["error"] if "error" in res else
                     f"{case.batch / res['median_s']:8.1f} samples/s (median of {n_steps} "
                     f"steps; warm-up {res['warmup_s']:.1f} s, loss {res['loss']:.3f})"))
        out[name] = {m: _summary(raw[m], case.batch) for m in MODES}
    return out


def _cell(s):
    if "median" not in s:
        return f"failed: {s['error']}"
    text = f"{s['median']:.1f}"
    if s["runs"] > 1:
        text += f" ({s['low']:.1f}-{s['high']:.1f})"
    if s["failed"]:
        text += f" [{s['failed']} run(s) failed: {s['error']}]"
    return text


def _ratio(a, b):
    return a["median"] / b["median"] if "median" in a and "median" in b else None


def _judge(ratio, target):
    if ratio is None:
        return f"not measured (>= {target}x)"
    return f"{ratio:.2f}x >= {target}x: {'met' if ratio >= target else 'NOT met'}"


def rows_of(results):
    """Table rows and one verdict line per target."""
    rows, verdicts = [], []
    for name, res in results.items():
        case = CASES[name]
        t, e, g = res["torch"], res["eager"], res["graph"]
        ratios = {"graph/torch": _ratio(g, t), "eager/torch": _ratio(e, t),
                  "graph/eager": _ratio(g, e)}
        rows.append([case.label, str(case.batch), _cell(t), _cell(e), _cell(g)] +
                    ["-" if r is None else f"{r:.2f}x" for r in ratios.values()])
        if case.graph_targets:
            verdicts.append(f"{name}: graph/torch {_judge(ratios['graph/torch'], GRAPH_VS_TORCH)}")
            verdicts.append(f"{name}: graph/eager {_judge(ratios['graph/eager'], GRAPH_VS_EAGER)}")
        verdicts.append(f"{name}: eager/torch {_judge(ratios['eager/torch'], EAGER_VS_TORCH)}")
    return rows, verdicts


HEADERS = ["model", "batch", "PyTorch eager samples/s", "pyflow eager samples/s",
           "pyflow graph samples/s", "graph/torch", "eager/torch", "graph/eager"]
TARGETS = (f"Targets (issue 16): pyflow graph >= {GRAPH_VS_TORCH}x PyTorch eager and >= "
           f"{GRAPH_VS_EAGER}x pyflow eager on the GPT and the CNN; pyflow eager >= "
           f"{EAGER_VS_TORCH}x PyTorch eager on all three (ratios of median samples/s).")


def _load():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def load_note(load_before, threads):
    """A warning when the machine was busy and the libraries' thread pools were on:
    a 2-thread OpenMP or numba region whose second thread is descheduled waits for
    it, so foreign load can slow a step many times (torch's most: its workers spin)."""
    try:
        busy = float(load_before.split()[0]) >= 0.5
    except (ValueError, IndexError):
        busy = False
    if not busy:
        return None
    return (f"note: the machine was busy (load average {load_before.split()[0]}); "
            + ("thread pools of 2+ threads are slowed by foreign load many times over, "
               "unevenly between the libraries: --threads 1 compares them more steadily"
               if not threads or threads > 1 else "the ranges show how much it moved runs"))


def markdown(machine, args, rows, verdicts, load_before, load_after, seconds):
    esc = lambda c: str(c).replace("|", "\\|")     # noqa: E731
    command = " ".join(["python bench/small_models.py"] + args.argv)
    lines = ["# Small models, training steps: PyTorch eager vs pyflow eager and graph", "",
             f"Generated by `{command}` on "
             f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} in "
             f"{seconds / 60:.1f} min.", "",
             f"- Machine: {machine}", f"- Load average before: {load_before}; after: "
             f"{load_after}", "",
             f"Each run its own process ({args.threads or 'default'} thread(s)), the three "
             f"modes alternating for {args.rounds} round(s); samples/s = batch / median step "
             "time of a run; median over runs (range).", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "|".join("---" for _ in HEADERS) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    lines += ["", TARGETS, ""] + [f"- {v}" for v in verdicts]
    note = load_note(load_before, args.threads)
    if note:
        lines += ["", note[0].upper() + note[1:] + "."]
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] + " " +
                                 __doc__.split("\n")[1])
    ap.add_argument("--models", nargs="+", choices=list(CASES), default=list(CASES))
    ap.add_argument("--rounds", type=positive, default=3, help="runs per mode (median)")
    ap.add_argument("--steps", type=positive, default=None, help="timed steps per run "
                    "(default per model: " + ", ".join(f"{k} {c.steps}" for k, c in
                                                        CASES.items()) + ")")
    ap.add_argument("--warmup", type=positive, default=None, help="skipped steps per run "
                    "(default per model: " + ", ".join(f"{k} {c.warmup}" for k, c in
                                                        CASES.items()) + ")")
    ap.add_argument("--threads", type=positive, default=None, help="threads per process "
                    "(default: each library's own)")
    ap.add_argument("--timeout", type=positive, default=900, help="seconds per run before "
                    "it counts as failed")
    ap.add_argument("--out", default=None, help="also write the results as Markdown here")
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=list(CASES), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.worker and not args.model:
        ap.error("--worker needs --model")
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        case = CASES[args.model]
        return emit_result(lambda: worker(args.worker, args.model, args.steps or case.steps,
                                          args.warmup or case.warmup))
    machine = machine_in_child(thread_env(args.threads))
    load_before = _load()
    print(f"{machine}\nload average: {load_before}")
    t0 = time.perf_counter()
    results = measure(args.models, args.rounds, args.steps, args.warmup, args.timeout,
                      args.threads)
    rows, verdicts = rows_of(results)
    print()
    print(table(rows, HEADERS))
    print()
    print(TARGETS)
    print("\n".join(verdicts))
    note = load_note(load_before, args.threads)
    if note:
        print(note)
    if args.out:
        with open(args.out, "w") as f:
            f.write(markdown(machine, args, rows, verdicts, load_before, _load(),
                             time.perf_counter() - t0))
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
