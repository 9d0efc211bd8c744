"""DLPerf-style training throughput: ResNet-50 v1.5, BERT-base (pre-training
heads) and GPT-2 small, pyflow (eager and ``nn.Graph``) against PyTorch eager,
on the same machine, model, batch, precision (FP32) and synthetic data.

Both sides run the *same model file*: pyflow runs ``models/<name>.py`` as it
is; the PyTorch side executes that very file with the name ``pyflow`` bound to
``torch`` (``load_model_module``), which works because the zoo is written
against PyTorch's API.  Same layers, same parameter names and counts (the smoke
test checks it), so the two columns time the frameworks, not two models.

DLPerf's method: skip warm-up steps, time the next steps (throughput =
samples / wall time of those steps), median of repeated runs.  Each run is its
own process and the frameworks alternate (torch, pyflow eager, pyflow graph,
then again), as in bench/graph_step.py: on 2 cores one framework's idle
thread pool would slow the other's next step in a shared process, and the
alternation spreads machine noise over all three alike.  The parent imports
neither library, so every child starts from the same environment (pyflow sets
``OMP_WAIT_POLICY`` at import; a parent that imported it would hand that to the
torch children).

Presets: ``cpu`` (the default) shrinks depth, resolution and vocabulary to fit
a 2-core machine, and says so in the table; ``cuda`` holds DLPerf's full
configurations for a GPU.  The scaling table runs the GPT preset (``--scaling``
picks others) on 1 and 2 ranks through ``pyflow-run -n N`` with eager
``DistributedDataParallel``, one thread per rank (also for 1 rank), the batch
per rank fixed as in DLPerf; speedup = 2-rank / 1-rank global samples/s.

    python bench/dlperf.py                          # CPU presets, writes bench/RESULTS.md
    python bench/dlperf.py --device cuda            # DLPerf's configurations on a GPU
    python bench/dlperf.py --models gpt --rounds 1 --out /tmp/r.md
    python bench/dlperf.py --amp bf16               # AMP only: its section of RESULTS.md
    python bench/dlperf.py --amp both               # FP32 and AMP in one run (AMP/FP32 ratios)

Targets (issue 6), CPU: GPT and BERT presets >= 1.0x PyTorch eager samples/s,
ResNet >= 0.5x; GPU: ResNet-50 and BERT-base >= 1.0x.  A target is met when
pyflow's better mode (eager or graph) reaches it; both ratios are shown.

Mixed precision (``--amp``): every configuration again in bfloat16 autocast.
PyTorch's step runs its forward and loss under ``torch.autocast(device,
dtype=torch.bfloat16)`` and its backward and optimizer step outside, as
PyTorch recommends; pyflow eager the same under ``pyflow.autocast``; pyflow
graph mode with ``graph.config.enable_amp(True, dtype=pyflow.bfloat16)``
(build() traced under autocast, float32 master weights; docs/amp.md).  The
step is ``make_amp_step`` here: bench/common.py's ``make_step`` with the loss
function wrapped in autocast (eager, torch), or an AMP ``nn.Graph`` of its own
(graph).  ``--amp bf16`` measures the three AMP columns only and replaces just
the ``## Mixed precision (bf16)`` section of ``--out`` (the FP32 tables stay);
``--amp both`` measures the FP32 and AMP columns in one invocation, all six
alternating within each round, writes the FP32 report as without ``--amp`` and
then the AMP section with pyflow AMP / pyflow FP32 ratios (``-`` when FP32 was
not measured in the same invocation).  Without ``--amp`` nothing changes: FP32
only, and the file's AMP section (like bench/roofline.py's and
bench/fused_ops.py's) is kept.  AMP targets (issue 18), CPU: pyflow AMP >= 1.0x
PyTorch AMP on all three models, and pyflow AMP >= 2.0x pyflow FP32 on GPT and
BERT, the better pyflow mode of each precision against the better one of the
other.
"""
import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from bench.common import (load_with, make_step, positive,  # noqa: E402  (imports neither
                          write_section)                      # library)

MODELS = ("resnet", "bert", "gpt")
MODES = ("torch", "eager", "graph")         # torch = PyTorch eager; eager/graph = pyflow's
AMP_DTYPES = {"bf16": "bfloat16"}           # --amp's precisions: the libraries' dtype names
AMP_SECTION = "## Mixed precision (bf16)"   # its own section of the results file
KEPT_SECTIONS = ("## Roofline", "## Fused ops", AMP_SECTION)    # other scripts' / runs'
RESULT = "RESULT "                          # prefix of a worker's one JSON line on stdout
ENV_AT_START = dict(os.environ)             # what every child inherits (see the docstring)


# ------------------------------------------------------------------ presets
@dataclasses.dataclass(frozen=True)
class Preset:
    """One benchmarked configuration: the model, what was shrunk, the batch per
    rank, the keyword arguments of the model's config and the target ratio."""
    model: str
    label: str
    shape: str          # stated in the table: resolution / depth / sequence / vocabulary
    batch: int
    config: dict
    target: float       # pyflow samples/s over PyTorch eager's, to meet
    amp_target: float = 0.0     # pyflow AMP samples/s over PyTorch AMP's (0: none)
    amp_gain: float = 0.0       # pyflow AMP samples/s over pyflow FP32's (0: none)


def _presets():
    gpt_small = dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257)
    bert_base = dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12,
                     intermediate_size=3072, vocab_size=30522)
    return {
        # A 2-core CPU: every step well under ~5 s, the whole default run ~5 min on a
        # quiet machine.  Widths stay the real ones (768, ResNet-50's channels) and a
        # batch is 1024 tokens, so the GEMMs have the real shapes' inner sizes; depth,
        # resolution and vocabulary shrink (the full 50257 / 30522-word heads alone
        # would cost 144-237 GFLOP a step).
        "cpu": {
            "resnet": Preset("resnet", "ResNet-50 v1.5", "64x64 images, 1000 classes", 8,
                             dict(image=64, num_classes=1000), 0.5, amp_target=1.0),
            "bert": Preset("bert", "BERT-base pretraining",
                           "2 of 12 layers (d=768), seq 128, vocab 8192", 8,
                           {**bert_base, "num_hidden_layers": 2, "vocab_size": 8192, "seq": 128},
                           1.0, amp_target=1.0, amp_gain=2.0),
            "gpt": Preset("gpt", "GPT-2 small", "2 of 12 layers (d=768), T=128, vocab 8192", 8,
                          {**gpt_small, "n_layer": 2, "vocab_size": 8192, "block_size": 128},
                          1.0, amp_target=1.0, amp_gain=2.0),
        },
        # DLPerf's configurations (FP32): ResNet-50 224x224 batch 128, BERT-base seq 128
        # batch 32; GPT-2 small (124M) at its full context, nanoGPT's batch 8.
        "cuda": {
            "resnet": Preset("resnet", "ResNet-50 v1.5", "224x224, 1000 classes (DLPerf)", 128,
                             dict(image=224, num_classes=1000), 1.0),
            "bert": Preset("bert", "BERT-base pretraining", "12 layers, seq 128 (DLPerf)", 32,
                           {**bert_base, "seq": 128}, 1.0),
            "gpt": Preset("gpt", "GPT-2 small", "12 layers, T=1024", 8,
                          {**gpt_small, "block_size": 1024}, 0.0),
        },
        # The GPU configurations cut to fit the few minutes a lent GPU lasts (bench/gpu_check
        # runs one round of them): DLPerf's widths, batches and ResNet/BERT sequence, less
        # depth and resolution.  Not DLPerf's numbers: a ratio against PyTorch on the same GPU.
        "cuda-small": {
            "resnet": Preset("resnet", "ResNet-50 v1.5", "112x112, 1000 classes (reduced)", 32,
                             dict(image=112, num_classes=1000), 1.0),
            "bert": Preset("bert", "BERT-base pretraining", "4 of 12 layers, seq 128 (reduced)",
                           32, {**bert_base, "num_hidden_layers": 4, "seq": 128}, 1.0),
            "gpt": Preset("gpt", "GPT-2 small", "4 of 12 layers, T=256 (reduced)", 8,
                          {**gpt_small, "n_layer": 4, "block_size": 256}, 0.0),
        },
        # Toy sizes for the smoke test of this script's machinery (tests/test_dlperf_bench.py).
        "tiny": {
            "resnet": Preset("resnet", "ResNet (1 block/stage, width 8)", "16x16, 10 classes", 2,
                             dict(image=16, num_classes=10, blocks=(1, 1, 1, 1), width=8), 0.5,
                             amp_target=1.0),
            "bert": Preset("bert", "BERT (tiny)", "2 layers d=32, seq 8, vocab 64", 2,
                           dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                intermediate_size=64, vocab_size=64,
                                max_position_embeddings=16, seq=8), 1.0,
                           amp_target=1.0, amp_gain=2.0),
            "gpt": Preset("gpt", "GPT (tiny)", "2 layers d=32, T=8, vocab 64", 2,
                          dict(n_layer=2, n_head=2, n_embd=32, vocab_size=64, block_size=8),
                          1.0, amp_target=1.0, amp_gain=2.0),
        },
    }


PRESETS = _presets()


# ------------------------------------------------------------------ models, both libraries
def load_model_module(name, lib):
    """``models/<name>.py`` for ``lib``: pyflow's own module, or for torch the same
    file executed with ``pyflow``, ``pyflow.nn`` and ``pyflow.nn.functional``
    bound to torch's while it is imported (bench.common.load_with)."""
    if lib.__name__ == "pyflow":
        return importlib.import_module(f"pyflow.models.{name}")
    return load_with(os.path.join(ROOT, "models", f"{name}.py"), lib,
                     f"_dlperf_{lib.__name__}_{name}")


def build(lib, preset, batch, device, rng):
    """(model, inputs, loss_of(model, *inputs), optimizer) for ``preset`` in ``lib``.

    Synthetic data as DLPerf's: random images and labels; BERT's masked-LM labels
    on 15% of positions (-100 elsewhere) and next-sentence labels; GPT's random
    tokens and next tokens.  Optimizers: SGD with momentum (ResNet, as DLPerf),
    AdamW (BERT, GPT)."""
    import numpy as np
    cfg = dict(preset.config)
    mod = load_model_module(preset.model, lib)
    F = lib.nn.functional

    def tensor(a):
        return lib.tensor(a, device=device)

    if preset.model == "resnet":
        image, classes = cfg.pop("image"), cfg["num_classes"]
        blocks = cfg.pop("blocks", None)
        model = (mod.ResNet(mod.Bottleneck, blocks, **cfg) if blocks else mod.resnet50(**cfg))
        inputs = (tensor(rng.standard_normal((batch, 3, image, image)).astype(np.float32)),
                  tensor(rng.integers(0, classes, batch)))

        def loss_of(model, x, y):
            return F.cross_entropy(model(x), y)
        # Goyal et al.'s linear scaling (0.1 per 256 images), as DLPerf's recipes: a sane
        # loss, so no step runs on NaNs or denormals.
        opt_of = lambda params: lib.optim.SGD(params, lr=0.1 * batch / 256,     # noqa: E731
                                              momentum=0.9)
    elif preset.model == "bert":
        seq = cfg.pop("seq")
        config = mod.BertConfig(**cfg)
        model = mod.BertForPreTraining(config)
        V = config.vocab_size
        labels = np.where(rng.random((batch, seq)) < 0.15, rng.integers(0, V, (batch, seq)), -100)
        types = np.zeros((batch, seq), np.int64)
        types[:, seq // 2:] = 1
        inputs = (tensor(rng.integers(1, V, (batch, seq))), tensor(types), tensor(labels),
                  tensor(rng.integers(0, 2, batch)))

        def loss_of(model, ids, types, labels, nsp):
            return model(ids, types, masked_lm_labels=labels, next_sentence_label=nsp)[2]
        opt_of = lambda params: lib.optim.AdamW(params, lr=1e-4)    # noqa: E731
    else:
        config = mod.GPTConfig(**cfg)
        model = mod.GPT(config)
        shape = (batch, config.block_size)
        inputs = (tensor(rng.integers(0, config.vocab_size, shape)),
                  tensor(rng.integers(0, config.vocab_size, shape)))

        def loss_of(model, x, y):
            return model(x, y)[1]
        opt_of = lambda params: lib.optim.AdamW(params, lr=1e-4)    # noqa: E731
    model = model.to(device)
    return model, inputs, loss_of, opt_of(model.parameters())


def _sync(lib, device):
    if device == "cuda":
        lib.cuda.synchronize()


def _threads(n):
    """Environment that limits every thread pool of a child to ``n`` threads."""
    return {k: str(n) for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                "MKL_NUM_THREADS")}


# ------------------------------------------------------------------ workers (child processes)
def _import(mode):
    sys.path.insert(0, ROOT)
    if mode == "torch":
        import torch as lib
    else:
        import pyflow as lib    # first: it sets NumPy's BLAS thread timeout (pyflow/__init__.py)
    return lib


def make_amp_step(lib, mode, model, inputs, loss_of, opt, amp=None, device="cpu"):
    """bench.common.make_step, in mixed precision when ``amp`` ("bf16") is given.

    torch and pyflow eager: the model's forward and loss run under
    ``lib.autocast(device, dtype=lib.bfloat16)``, zero_grad, backward and the
    optimizer step outside it (PyTorch's recipe), by wrapping ``loss_of``.
    pyflow graph: an ``nn.Graph`` with ``config.enable_amp(True, dtype=)``
    (make_step's graph has no such option, so this one is built here)."""
    if not amp:
        return make_step(lib, mode, model, inputs, loss_of, opt)
    dtype = getattr(lib, AMP_DTYPES[amp])
    if mode == "graph":
        class AmpTrainGraph(lib.nn.Graph):
            def __init__(self):
                super().__init__()
                self.model = model
                self.add_optimizer(opt)
                self.config.enable_amp(True, dtype=dtype)

            def build(self, *inputs):
                loss = loss_of(self.model, *inputs)
                loss.backward()
                return loss
        graph = AmpTrainGraph()
        return lambda: graph(*inputs)

    def amp_loss_of(model, *inputs):
        with lib.autocast(device, dtype=dtype):
            return loss_of(model, *inputs)
    return make_step(lib, mode, model, inputs, amp_loss_of, opt)


def timed_worker(mode, preset, batch, device, steps, warmup, amp=None):
    """Train ``warmup`` + ``steps`` steps and time the last ``steps`` (in mixed
    precision when ``amp`` is given, see ``make_amp_step``).

    On a GPU (DLPerf's case: many steps, asynchronous launches) throughput is
    samples / wall time of all timed steps.  On the CPU it is batch / the median
    step time: a run has only a few steps there, and on a shared 2-core machine
    one burst of foreign load would otherwise decide the number (the CPU steps
    are synchronous, so timing each one costs nothing)."""
    lib = _import(mode)         # before NumPy: pyflow sets OpenBLAS's thread timeout
    import numpy as np
    lib.manual_seed(0)
    model, inputs, loss_of, opt = build(lib, preset, batch, device, np.random.default_rng(0))
    step = make_amp_step(lib, mode, model, inputs, loss_of, opt, amp, device)
    t0 = time.perf_counter()
    for _ in range(warmup):
        loss = step()
    _sync(lib, device)
    warm_s = time.perf_counter() - t0
    times = []
    t0 = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t)
    last = float(loss.item())         # waits for the last step everywhere
    _sync(lib, device)
    seconds = time.perf_counter() - t0
    rate = batch * steps / seconds if device == "cuda" else batch / statistics.median(times)
    return {"samples_per_s": rate, "seconds": seconds, "step_s": times, "warmup_s": warm_s,
            "loss": last}


def ddp_worker(preset, batch, steps, warmup):
    """One rank of the scaling run: eager DDP, the batch per rank fixed; every
    rank returns the global samples/s, world size x batch / its median step
    time (a step ends with the gradients' all-reduce, so all ranks agree)."""
    lib = _import("eager")      # before NumPy, as above
    import numpy as np
    from pyflow import comm
    world = comm.world()
    lib.manual_seed(0)
    model, inputs, loss_of, opt = build(lib, preset, batch, "cpu",
                                        np.random.default_rng(world.rank))
    ddp = lib.nn.parallel.DistributedDataParallel(model)
    step = make_step(lib, "eager", ddp, inputs, loss_of, opt)
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):        # a barrier first, so every step starts together
        world.barrier()
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"step_s": times, "ranks": world.size,
            "samples_per_s": world.size * batch / statistics.median(times)}


def probe_cuda():
    """Why each library cannot run on a GPU here (None when it can)."""
    sys.path.insert(0, ROOT)
    import torch
    import pyflow.cuda
    return {"pyflow": pyflow.cuda.unavailable_reason(),
            "torch": None if torch.cuda.is_available() else
            f"this torch ({torch.__version__}) sees no CUDA device"}


def _emit(fn):
    """Run a worker, print its result (or its error, honestly) as one JSON line."""
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 (reported in the table, not hidden)
        out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
    print(RESULT + json.dumps(out), flush=True)


# ------------------------------------------------------------------ the parent: runs, tables
def _parse_result(proc, what):
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT)]
    if lines:
        return json.loads(lines[-1][len(RESULT):])
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"error": f"{what} exited with status {proc.returncode}: {tail}"[:300]}


def _worker_args(args, model, batch):
    return ["--preset", args.preset, "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--model", model, "--batch", str(batch), "--device", args.device]


def measure(args, mode, model, batch, timeout, amp=None):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode] + \
        _worker_args(args, model, batch) + (["--amp", amp] if amp else [])
    env = dict(ENV_AT_START)
    if args.threads:
        env.update(_threads(args.threads))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    return _parse_result(proc, f"{mode} worker")


def launcher():
    """``pyflow-run`` beside this interpreter, else ``python -m pyflow.distributed.launch``."""
    beside = os.path.join(os.path.dirname(sys.executable), "pyflow-run")
    if os.path.isfile(beside) and os.access(beside, os.X_OK):
        return [beside]
    return [sys.executable, "-m", "pyflow.distributed.launch"]


def measure_ddp(args, model, batch, ranks, timeout):
    cmd = launcher() + ["-n", str(ranks), os.path.abspath(__file__), "--ddp-worker"] + \
        _worker_args(args, model, batch)
    env = {k: v for k, v in ENV_AT_START.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(_threads(1), PYTHONPATH=ROOT)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"{ranks}-rank run timed out after {timeout} s"}
    result = _parse_result(proc, f"pyflow-run -n {ranks}")
    if "error" not in result and proc.returncode:
        result = {"error": f"pyflow-run -n {ranks} exited with status {proc.returncode}"}
    return result


def _summary(results):
    """Median samples/s over the runs that worked, their range, and the first error."""
    rates = [r["samples_per_s"] for r in results if "error" not in r]
    errors = [r["error"] for r in results if "error" in r]
    if not rates:
        return {"error": errors[0] if errors else "not run"}
    return {"median": statistics.median(rates), "low": min(rates), "high": max(rates),
            "runs": len(rates), "failed": len(errors), "error": errors[0] if errors else None}


def columns(amp=None):
    """[(key, mode, amp)] of the throughput runs for ``--amp``: the FP32 modes
    (keys "torch", "eager", "graph"), the AMP ones ("torch bf16"...) or both."""
    fp32 = [(m, m, None) for m in MODES]
    mixed = [(f"{m} bf16", m, "bf16") for m in MODES]
    return {None: fp32, "bf16": mixed, "both": fp32 + mixed}[amp]


def run_throughput(args, log=print):
    """{model: {key: summary}} (keys: ``columns(args.amp)``), the columns
    alternating within each round."""
    out = {}
    cols = columns(getattr(args, "amp", None))
    for model in args.models:
        batch = args.batch or PRESETS[args.preset][model].batch
        raw = {key: [] for key, _, _ in cols}
        for r in range(args.rounds):
            for key, mode, amp in cols:
                res = measure(args, mode, model, batch, args.timeout, amp)
                log(f"  {model:6s} round {r + 1}/{args.rounds} {key:10s}: " +
                    (f"{res['samples_per_s']:.2f} samples/s" if "error" not in res
                     else res["error"]))
                raw[key].append(res)
        out[model] = {key: _summary(raw[key]) for key in raw}
    return out


def run_scaling(args, log=print):
    """{model: {ranks: summary}} of the eager-DDP runs, 1 and 2 ranks alternating."""
    out = {}
    for model in args.scaling:
        batch = args.batch or PRESETS[args.preset][model].batch
        raw = {1: [], 2: []}
        for r in range(args.rounds):
            for n in (1, 2):
                res = measure_ddp(args, model, batch, n, args.timeout)
                log(f"  {model:6s} round {r + 1}/{args.rounds} DDP {n} rank(s): " +
                    (f"{res['samples_per_s']:.2f} samples/s" if "error" not in res
                     else res["error"]))
                raw[n].append(res)
        out[model] = {n: _summary(v) for n, v in raw.items()}
    return out


# ------------------------------------------------------------------ the report
def _cell(s, digits=1):
    if "median" not in s:
        return f"failed: {s['error']}"
    text = f"{s['median']:.{digits}f}"
    if s["runs"] > 1:
        text += f" ({s['low']:.{digits}f}-{s['high']:.{digits}f})"
    if s.get("failed"):
        text += f" [{s['failed']} run(s) failed: {s['error']}]"
    return text


def _ratio(a, b, stat="median"):
    """a / b of the runs' medians, or of their best runs (``stat="high"``)."""
    return a[stat] / b[stat] if stat in a and stat in b else None


def _ratios(a, b):
    """'median ratio (best ratio)': on a shared machine a burst of foreign load can
    slow every step of a run, and then only the best runs still compare the
    libraries, so both are shown."""
    med, best = _ratio(a, b), _ratio(a, b, "high")
    if med is None:
        return "-"
    text = f"{med:.2f}x"
    return text if a["runs"] == b["runs"] == 1 else text + f" (best {best:.2f}x)"


def _met(pairs, target):
    """Whether pyflow's better mode reaches ``target``, by medians and by best runs."""
    if not target:
        return "no target"
    verdicts = []
    for stat in ("median", "high"):
        ratios = [r for r in (_ratio(a, b, stat) for a, b in pairs) if r is not None]
        verdicts.append(max(ratios) >= target if ratios else None)
    by_median, by_best = verdicts
    if by_median is None:
        return "not measured"
    if by_median == by_best:
        return "met" if by_median else "not met"
    return "met by medians only" if by_median else "met by best runs only"


def throughput_rows(preset_name, results, batch_override=None):
    rows = []
    for model, res in results.items():
        p = PRESETS[preset_name][model]
        torch_, eager, graph = res["torch"], res["eager"], res["graph"]
        rows.append([p.label, p.shape, str(batch_override or p.batch), _cell(torch_),
                     _cell(eager), _cell(graph), _ratios(eager, torch_), _ratios(graph, torch_),
                     f">= {p.target:.1f}x" if p.target else "-",
                     _met([(eager, torch_), (graph, torch_)], p.target)])
    return rows


THROUGHPUT_HEADERS = ["model", "preset", "batch", "PyTorch eager samples/s",
                      "pyflow eager samples/s", "pyflow graph samples/s", "eager/torch",
                      "graph/torch", "target", "met"]


def scaling_rows(preset_name, results, batch_override=None):
    rows = []
    for model, res in results.items():
        p = PRESETS[preset_name][model]
        speedup, best = _ratio(res[2], res[1]), _ratio(res[2], res[1], "high")
        rows.append([p.label, p.shape, str(batch_override or p.batch), _cell(res[1]),
                     _cell(res[2]), _ratios(res[2], res[1]),
                     "-" if speedup is None else f"{100 * speedup / 2:.0f}%" +
                     ("" if res[1]["runs"] == res[2]["runs"] == 1 else
                      f" (best {100 * best / 2:.0f}%)")])
    return rows


def _better(a, b):
    """pyflow's better mode of one precision, as a summary: the larger median and
    the larger best run (either mode's; a failed mode counts as absent)."""
    ok = [s for s in (a, b) if s and "median" in s]
    if not ok:
        return {"error": "not measured"}
    return {"median": max(s["median"] for s in ok), "high": max(s["high"] for s in ok),
            "runs": max(s["runs"] for s in ok)}


def amp_rows(preset_name, results, batch_override=None):
    """The AMP table's rows: PyTorch AMP, pyflow eager and graph AMP samples/s,
    pyflow over PyTorch AMP, pyflow AMP over pyflow FP32 per mode (``-`` when
    this run measured no FP32), and both targets: ``amp_target`` judged by
    pyflow's better AMP mode against PyTorch AMP, ``amp_gain`` by pyflow's
    better AMP mode against its better FP32 mode."""
    rows = []
    for model, res in results.items():
        p = PRESETS[preset_name][model]
        torch_, eager, graph = res["torch bf16"], res["eager bf16"], res["graph bf16"]
        eager32, graph32 = res.get("eager", {}), res.get("graph", {})
        rows.append([p.label, p.shape, str(batch_override or p.batch), _cell(torch_),
                     _cell(eager), _cell(graph), _ratios(eager, torch_), _ratios(graph, torch_),
                     _ratios(eager, eager32), _ratios(graph, graph32),
                     f"pyflow/torch AMP >= {p.amp_target:.1f}x" if p.amp_target else "-",
                     _met([(eager, torch_), (graph, torch_)], p.amp_target),
                     f"pyflow AMP/FP32 >= {p.amp_gain:.1f}x" if p.amp_gain else "-",
                     _met([(_better(eager, graph), _better(eager32, graph32))], p.amp_gain)])
    return rows


AMP_HEADERS = ["model", "preset", "batch", "PyTorch AMP samples/s", "pyflow eager AMP samples/s",
               "pyflow graph AMP samples/s", "eager/torch AMP", "graph/torch AMP",
               "eager AMP/FP32", "graph AMP/FP32", "target", "met", "target", "met"]


SCALING_HEADERS = ["model", "preset", "batch per rank", "1 rank samples/s",
                   "2 ranks samples/s (global)", "speedup", "efficiency"]


def markdown_table(rows, headers):
    esc = lambda c: str(c).replace("|", "\\|")     # noqa: E731
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows])


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git(*argv):
    try:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_facts():
    """CPU model and cores, load, versions and commit, without importing torch or pyflow."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)
    except OSError:
        pass
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    if _git("status", "--porcelain", "--untracked-files=no"):
        commit += " + uncommitted changes"
    return {"cpu": cpu, "cores": os.cpu_count(), "load": _uptime(), "load1": _load1(),
            "versions": f"Python {platform.python_version()}, numpy {_version('numpy')}, "
                        f"numba {_version('numba')}, torch {_version('torch')}, "
                        f"pyflow {_version('pyflow')} (git {commit})"}


def _load1():
    """The 1-minute load average (None where /proc/loadavg is missing)."""
    try:
        with open("/proc/loadavg") as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True,
                              timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        try:
            with open("/proc/loadavg") as f:
                return "load average " + " ".join(f.read().split()[:3])
        except OSError:
            return "unknown"


def report(args, facts, throughput, scaling, load_after, command, started, seconds):
    threads = f"{args.threads} per process" if args.threads else "each library's default"
    lines = [
        "# DLPerf-style training throughput: pyflow vs PyTorch",
        "",
        f"Generated by `{command}` on {started} in {seconds / 60:.1f} min.",
        "",
        f"- Machine: {facts['cpu']}, {facts['cores']} cores; device `{args.device}`; "
        f"threads: {threads}.",
        f"- Versions: {facts['versions']}.",
        f"- Load (`uptime`) before: `{facts['load']}`",
        f"- Load (`uptime`) after: `{load_after}`",
        "",
    ]
    if facts.get("load1") is not None and facts["load1"] >= 0.5:
        lines += [
            f"**The machine was shared with other work** (load average {facts['load1']:.1f} "
            f"on {facts['cores']} cores before this run started).  A burst of foreign load "
            f"can slow every step of a run several times (2 threads on 2 shared cores), so "
            f"the ranges are wide; the best-run ratios are the better estimate, and a quiet "
            f"machine gives DLPerf-grade numbers.", ""]
    lines += [
        f"Method (DLPerf's): FP32, synthetic data, the same model file for both libraries; "
        f"skip {args.warmup} warm-up steps, time the next {args.steps}; samples/s = "
        + ("samples / wall time of those steps" if args.device == "cuda" else
           "batch / median step time (robust to bursts of foreign load on a shared machine)")
        + f"; the median of {args.rounds} runs, each its own process, the three "
        f"columns alternating (range in parentheses).  ResNet trains with SGD + momentum, "
        f"BERT (masked LM on 15% of positions + next sentence, dropout 0.1) and GPT with AdamW.",
        "",
    ]
    if throughput:
        lines += ["## Throughput", "", markdown_table(
            throughput_rows(args.preset, throughput, args.batch), THROUGHPUT_HEADERS), "",
            "Targets (issue 6): on CPU, GPT and BERT >= 1.0x PyTorch eager, ResNet >= 0.5x; "
            "on a GPU, ResNet-50 and BERT-base >= 1.0x.  `met` takes pyflow's better mode, "
            "judged by the median ratio and by the best-run ratio (both named when they "
            "disagree).", ""]
    if scaling:
        lines += ["## Data-parallel scaling (pyflow eager DDP over MPI)", "", markdown_table(
            scaling_rows(args.preset, scaling, args.batch), SCALING_HEADERS), "",
            "`pyflow-run -n N` on this machine, one thread per rank (the 1-rank baseline too), "
            "the batch per rank fixed (weak scaling, as DLPerf); speedup = 2-rank / 1-rank "
            "global samples/s, efficiency = speedup / 2.", ""]
    return "\n".join(lines)


def amp_report(args, facts, throughput, load_after, command, started, seconds):
    """The ``## Mixed precision (bf16)`` section: its own provenance (it may be
    written by a run other than the FP32 tables'), the AMP table and its method."""
    threads = f"{args.threads} per process" if args.threads else "each library's default"
    fp32 = "in this run" if args.amp == "both" else "not in this run (use `--amp both`)"
    lines = [
        AMP_SECTION, "",
        f"Generated by `{command}` on {started} in {seconds / 60:.1f} min; "
        f"{facts['cpu']}, {facts['cores']} cores; device `{args.device}`; threads: {threads}; "
        f"{facts['versions']}.  Load (`uptime`) before: `{facts['load']}`; after: "
        f"`{load_after}`.", ""]
    if facts.get("load1") is not None and facts["load1"] >= 0.5:
        lines += [f"**The machine was shared with other work** (load average "
                  f"{facts['load1']:.1f} on {facts['cores']} cores before this run started): "
                  f"the best-run ratios are the better estimate.", ""]
    lines += [
        markdown_table(amp_rows(args.preset, throughput, args.batch), AMP_HEADERS), "",
        f"bfloat16 autocast: PyTorch's forward and loss under `torch.autocast(\"{args.device}\", "
        f"dtype=torch.bfloat16)`, backward and optimizer step outside; pyflow eager the same "
        f"under `pyflow.autocast`; pyflow graph with `graph.config.enable_amp(True, "
        f"dtype=pyflow.bfloat16)`.  Float32 master weights everywhere.  The same models, "
        f"data and timing as the FP32 table (skip {args.warmup} steps, time {args.steps}, "
        f"median of {args.rounds} runs, the columns alternating).  FP32 measured {fp32}; "
        f"AMP/FP32 = a pyflow mode's AMP samples/s over the same mode's FP32.",
        "",
        "Targets (issue 18): pyflow AMP >= 1.0x PyTorch AMP (pyflow's better mode); on GPT "
        "and BERT pyflow AMP >= 2.0x pyflow FP32 (pyflow's better AMP mode over its better "
        "FP32 mode).  `met` is judged by the median ratio and by the best-run ratio (both "
        "named when they disagree).", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------ command line
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="DLPerf-style training throughput of ResNet-50 "
                                 "v1.5, BERT-base and GPT-2 small: pyflow (eager, graph) vs "
                                 "PyTorch eager (FP32; bf16 autocast with --amp), and pyflow's 1 -> 2 rank DDP "
                                 "scaling.",
                                 epilog="Presets: " + "; ".join(
                                     f"{d}: " + ", ".join(f"{p.label} ({p.shape}, batch "
                                                          f"{p.batch})" for p in ps.values())
                                     for d, ps in PRESETS.items()))
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--preset", choices=list(PRESETS),
                    help="model sizes (default: the device's: cpu or cuda)")
    ap.add_argument("--models", nargs="*", choices=MODELS, default=list(MODELS),
                    help="models of the throughput table (none: skip it)")
    ap.add_argument("--scaling", nargs="*", choices=MODELS, default=None,
                    help="models of the 1 -> 2 rank scaling table (default: gpt on cpu, "
                         "none on cuda; none: skip it)")
    ap.add_argument("--rounds", type=positive, default=3, help="runs per column (median)")
    ap.add_argument("--steps", type=positive, default=None,
                    help="timed steps per run (default 5 on cpu, 100 on cuda as DLPerf)")
    ap.add_argument("--warmup", type=positive, default=None,
                    help="skipped steps per run (default 2 on cpu, 20 on cuda as DLPerf)")
    ap.add_argument("--batch", type=positive, default=None,
                    help="batch per rank for every model (default: the preset's)")
    ap.add_argument("--threads", type=positive, default=None,
                    help="threads per process in the throughput table (default: the libraries')")
    ap.add_argument("--timeout", type=positive, default=600, help="seconds per run before "
                    "it counts as failed")
    ap.add_argument("--amp", choices=["bf16", "both"], default=None,
                    help="mixed precision: bf16 = the AMP table only (its own section of "
                         "--out), both = FP32 and AMP in one run (with AMP/FP32 ratios); "
                         "default: FP32 only")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "RESULTS.md"),
                    help="Markdown file to write ('-': print only)")
    # internal: the child processes
    ap.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--ddp-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--probe-cuda", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cuda = args.device == "cuda"
    args.preset = args.preset or args.device
    args.steps = args.steps or (100 if cuda else 5)
    args.warmup = args.warmup or (20 if cuda else 2)
    if args.worker is None and args.amp == "bf16" and args.scaling:
        ap.error("--scaling is an FP32 table: with --amp bf16 (the AMP table only) leave it "
                 "out, or use --amp both")
    if args.scaling is None:
        args.scaling = [] if cuda or args.amp == "bf16" else ["gpt"]
    if cuda and args.scaling:
        ap.error("--scaling runs on CPU ranks only; on a GPU machine use --scaling with "
                 "--device cpu, or leave it out")
    return args


def check_cuda():
    """None when pyflow can run on a GPU here, else why not; torch's problem is
    returned too (its column then shows it)."""
    if ENV_AT_START.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        sim = ("NUMBA_ENABLE_CUDASIM is set: numba's CUDA simulator runs the kernels one "
               "thread at a time, its timings mean nothing; unset it on a machine with a GPU")
        return sim, None
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--probe-cuda"],
                          capture_output=True, text=True, env=ENV_AT_START, timeout=300)
    res = _parse_result(proc, "the CUDA probe")
    if "error" in res:
        return res["error"], None
    return res["pyflow"], res["torch"]


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        preset = PRESETS[args.preset][args.model]
        return _emit(lambda: timed_worker(args.worker, preset, args.batch, args.device,
                                          args.steps, args.warmup, args.amp))
    if args.ddp_worker:
        preset = PRESETS[args.preset][args.model]
        return _emit(lambda: ddp_worker(preset, args.batch, args.steps, args.warmup))
    if args.probe_cuda:
        return _emit(probe_cuda)

    if args.device == "cuda":
        pyflow_problem, torch_problem = check_cuda()
        if pyflow_problem:
            sys.exit(f"dlperf: --device cuda needs a real GPU that pyflow can use: "
                     f"{pyflow_problem}")
        if torch_problem:
            print(f"dlperf: note: {torch_problem}; the PyTorch column will say so")
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    command = "python bench/dlperf.py" + ("" if argv is None and len(sys.argv) == 1 else
                                          " " + " ".join(sys.argv[1:] if argv is None else argv))
    facts = machine_facts()
    print(f"{facts['cpu']}, {facts['cores']} cores; {facts['versions']}\nload: {facts['load']}")
    t0 = time.perf_counter()
    throughput = run_throughput(args) if args.models else {}
    scaling = run_scaling(args) if args.scaling else {}
    load_after, seconds = _uptime(), time.perf_counter() - t0
    if args.amp != "bf16":          # the FP32 report, as without --amp
        text = report(args, facts, throughput, scaling, load_after, command, started, seconds)
        print()
        print(text)
        if args.out != "-":
            kept = _kept_sections(args.out, skip=(AMP_SECTION,) if args.amp else ())
            with open(args.out, "w") as f:
                f.write(text + "\n" + (f"\n{kept}" if kept else ""))
            print(f"written to {os.path.relpath(args.out)}")
    if args.amp and throughput:
        text = amp_report(args, facts, throughput, load_after, command, started, seconds)
        print()
        print(text)
        if args.out != "-":
            write_section(args.out, AMP_SECTION, text)
            print(f"{AMP_SECTION} written to {os.path.relpath(args.out)}")
    return 0


def _section(text, heading):
    """The section ``heading`` of the Markdown ``text`` (up to the next ``## ``), or ''."""
    if "\n" + heading not in "\n" + text:
        return ""
    section = ("\n" + text).split("\n" + heading, 1)[1]
    end = section.find("\n## ")
    return heading + (section[:end + 1] if end >= 0 else section)


def _kept_sections(path, skip=()):
    """The sections other scripts (bench/roofline.py, bench/fused_ops.py) or an
    ``--amp`` run wrote into ``path``, in the file's order, kept when this script
    rewrites the file ('' when none); ``skip``: headings not to keep."""
    if not os.path.exists(path):
        return ""
    text = open(path).read()
    found = [(("\n" + text).find("\n" + h), _section(text, h)) for h in KEPT_SECTIONS
             if h not in skip]
    parts = [sec.rstrip("\n") + "\n" for _, sec in sorted(found) if sec]
    return "\n".join(parts)


if __name__ == "__main__":
    sys.exit(main())
