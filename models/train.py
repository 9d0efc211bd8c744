"""The trainer: train a model of the zoo on one rank, or on many: data, tensor
or hybrid (2-D) parallel.

    python -m pyflow.models.train --model gpt --preset tiny --steps 300 --out runs/tiny
    pyflow-run -n 2 models/train.py --model gpt --preset tiny --batch-size 32 --out runs/dp2

Data: ``--data chars`` (default for GPT) is a character-level corpus of
pyflow's own documentation and source (models/data.py), with a held-out split
whose loss is reported; ``--data PATH`` any UTF-8 text file; ``--data
synthetic`` DLPerf-style random tokens/images for throughput; ``--data digits``
the generated digits (default for the MLP).

Steps: ``--batch-size`` is the *global* batch: with ``--parallel dp`` on N ranks
every rank draws the same global batch from the same seeded generator and
keeps its own 1/N slice, so N ranks take exactly the steps one rank would (the
gradients are averaged by ``DistributedDataParallel``).  The LR schedule is a
linear warm-up then a cosine decay to 1/10 (``LambdaLR``).  ``--graph`` runs the
step as a ``pyflow.nn.Graph`` (forward, backward and update compiled once).
``--amp bf16`` runs forward and loss under ``pyflow.autocast`` (bfloat16
matrix products, float32 losses), eager or graph; ``--amp fp16`` under
float16 autocast with a ``pyflow.amp.GradScaler``, whose state the checkpoint
keeps.  In graph mode the graph traces under autocast
(``graph.config.enable_amp``) and does the scaler's steps
(``graph.set_grad_scaler``).

Parallelism: ``--parallel dp`` in eager mode is ``DistributedDataParallel``;
in graph mode, and for ``--parallel tp|hybrid``, the parameters become global
tensors (``make_global``): replicated for data parallel with the batch split
along dim 0; for tensor parallel GPT's MLP is split as Megatron does
(``megatron_sbp``) and the batch replicated; ``hybrid`` puts the ranks on a
(ranks / --tp-size) x --tp-size grid, data parallel along the first axis and
tensor parallel along the second.  Every mode gives the one-rank losses.

Checkpoints (``--ckpt-dir``, every ``--ckpt-every`` steps and at the end) hold
the model, optimizer, scheduler, step, RNG states (the batch generator's state
is the data position) and the run's configuration, written atomically by
``pyflow.save``; ``--resume`` continues to exactly the losses of an
uninterrupted run.  A checkpoint is never overwritten by a run that did not
``--resume`` it, nor resumed by a run with a different configuration.

Rank 0 shows a progress bar, writes ``train_log.csv`` (step, loss, lr,
samples_per_s, val_loss) and, when matplotlib is installed, ``loss.png`` to
``--out``.  Errors in the flags, the corpus, the folders or the checkpoint,
and a model or batch that cannot fit in this machine's memory, print one line
and exit with status 2, before anything is written.  At start the temporary
files that killed saves left in ``--ckpt-dir`` are removed.
"""
import argparse
import csv
import math
import os
import sys
import time
import types

if __name__ == "__main__" and not __package__:
    # Run as a file (pyflow-run -n 2 models/train.py): its folder is sys.path[0],
    # where data.py / gpt.py would shadow any top-level module of those names.
    sys.path.pop(0)

import pyflow                                           # noqa: E402
from pyflow import nn                                   # noqa: E402
from pyflow.models.data import CharCorpus, Digits, SyntheticImages, SyntheticTokens  # noqa: E402
from pyflow.models.gpt import GPT, PRESETS              # noqa: E402
from pyflow.models.mlp import MLP                       # noqa: E402
from pyflow.models import parallel_layout               # noqa: E402
from pyflow.utils.serialization import remove_stale_temporaries  # noqa: E402

__all__ = ["main", "run", "setup", "train_loop", "summarize", "report", "parse_args",
           "TrainError", "WarmupCosine"]

CKPT_NAME = "ckpt.safetensors"
LOG_NAME = "train_log.csv"
PLOT_NAME = "loss.png"
LOG_FIELDS = ("step", "loss", "lr", "samples_per_s", "val_loss")
MLP_PRESETS = {"tiny": (256, 256), "mini": (1024, 1024)}
DEFAULT_LR = {"adamw": 1e-3, "sgd": 0.1}


class TrainError(Exception):
    """A problem with the flags, the data or a checkpoint: reported in one line."""


class WarmupCosine:
    """LR factor: linear warm-up over ``warmup`` steps, then a cosine from 1 to
    ``min_ratio`` at ``total`` steps.  A callable object (not a lambda) so that
    ``LambdaLR.state_dict`` saves its numbers with the checkpoint."""

    def __init__(self, warmup, total, min_ratio=0.1):
        self.warmup, self.total, self.min_ratio = int(warmup), int(total), float(min_ratio)

    def __call__(self, step):
        if step < self.warmup:
            return (step + 1) / self.warmup
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# ------------------------------------------------------------------ flags
def _int_at_least(low):
    def parse(text):
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {n}")
        return n
    return parse


def _positive_float(text):
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not x > 0 or math.isinf(x):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return x


def _non_negative_float(text):
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not (x >= 0 and math.isfinite(x)):      # nan fails x >= 0
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return x


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in one line (not the usage block first)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser():
    p = _Parser(prog="pyflow-train", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=("gpt", "mlp"), default="gpt")
    p.add_argument("--preset", default="tiny",
                   help=f"model size; gpt: {', '.join(PRESETS)}; mlp: {', '.join(MLP_PRESETS)}")
    p.add_argument("--batch-size", type=_int_at_least(1), default=32,
                   help="global batch (split across ranks)")
    p.add_argument("--block-size", type=_int_at_least(1), default=None,
                   help="GPT context length (default: the preset's)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_int_at_least(1), default=None,
                        help="optimizer steps (default 200)")
    length.add_argument("--epochs", type=_int_at_least(1), default=None,
                        help="passes over the training split's tokens/samples")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    p.add_argument("--lr", type=_positive_float, default=None,
                   help="peak learning rate (default 1e-3 for adamw, 0.1 for sgd)")
    p.add_argument("--weight-decay", type=_non_negative_float, default=0.1)
    p.add_argument("--warmup", type=_int_at_least(0), default=None,
                   help="linear warm-up steps (default: a tenth of the steps, at most 100)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--graph", dest="graph", action="store_true",
                      help="run the training step as a compiled pyflow.nn.Graph")
    mode.add_argument("--eager", dest="graph", action="store_false", help="(default)")
    p.add_argument("--parallel", choices=("dp", "tp", "hybrid"), default="dp",
                   help="dp: data parallel over the MPI ranks (one rank: plain training); "
                        "tp: tensor parallel (GPT: Megatron's MLP split) with global "
                        "tensors; hybrid: a (ranks / --tp-size) x --tp-size grid, data "
                        "parallel along the first axis, tensor parallel along the second")
    p.add_argument("--tp-size", type=_int_at_least(1), default=2,
                   help="ranks per tensor-parallel group of --parallel hybrid")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--amp", choices=("none", "bf16", "fp16"), default="none",
                   help="mixed precision: autocast to bfloat16, or to float16 with loss "
                        "scaling (eager only)")
    p.add_argument("--data", default=None,
                   help="chars (pyflow's own text, GPT default), a text file path, synthetic, "
                        "or digits (MLP default)")
    p.add_argument("--out", default=None, help="folder for train_log.csv and loss.png")
    p.add_argument("--ckpt-dir", default=None, help="folder of the checkpoint")
    p.add_argument("--ckpt-every", type=_int_at_least(0), default=0,
                   help="checkpoint every K steps (0: only at the end)")
    p.add_argument("--resume", action="store_true", help="continue the checkpoint in --ckpt-dir")
    p.add_argument("--eval-every", type=_int_at_least(0), default=50,
                   help="held-out loss every K steps (0: only at the end)")
    p.add_argument("--eval-iters", type=_int_at_least(1), default=10,
                   help="batches per held-out evaluation")
    p.add_argument("--seed", type=_int_at_least(0), default=0)
    p.add_argument("--stop-after", type=_int_at_least(1), default=None, metavar="K",
                   help="stop after step K as if the job had been killed (to try --resume)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def parse_args(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.resume and not args.ckpt_dir:
        parser.error("--resume needs --ckpt-dir (the folder holding the checkpoint)")
    if args.ckpt_every and not args.ckpt_dir:
        parser.error("--ckpt-every needs --ckpt-dir")
    presets = PRESETS if args.model == "gpt" else MLP_PRESETS
    if args.preset not in presets:
        parser.error(f"--preset {args.preset!r} is not a {args.model} preset; choose from "
                     f"{', '.join(presets)}")
    if args.data is None:
        args.data = "chars" if args.model == "gpt" else "digits"
    if args.model == "mlp" and args.data not in ("synthetic", "digits"):
        parser.error(f"--model mlp trains on --data digits or synthetic, got {args.data!r}")
    if args.model == "gpt" and args.data == "digits":
        parser.error("--data digits is for --model mlp")
    if args.lr is None:
        args.lr = DEFAULT_LR[args.optimizer]
    return args


# ------------------------------------------------------------------ pieces
def _share_cores(local_ranks):
    """Ranks on one machine share its cores: give each rank its part (unless the
    launcher or the user already chose), so N ranks do not each start one
    numba and one BLAS thread per core."""
    if local_ranks <= 1 or "NUMBA_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in os.environ:
        return
    threads = max(1, (os.cpu_count() or 1) // local_ranks)
    import numba
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    from threadpoolctl import threadpool_limits
    threadpool_limits(threads)


def load_data(args, vocab_size):
    if args.data == "synthetic":
        return SyntheticTokens(vocab_size) if args.model == "gpt" else SyntheticImages()
    if args.data == "digits":
        return Digits(seed=args.seed)
    try:
        return CharCorpus.from_project() if args.data == "chars" else CharCorpus.from_file(args.data)
    except (FileNotFoundError, IsADirectoryError) as e:     # their messages name the corpus
        raise TrainError(str(e)) from None
    except OSError as e:
        raise TrainError(f"corpus {args.data!r} cannot be read ({e.strerror or e}); --data "
                         f"takes a UTF-8 text file, chars or synthetic") from None
    except ValueError:
        raise TrainError(f"corpus {args.data!r} holds no text to train on; --data takes a "
                         f"UTF-8 text file, chars or synthetic") from None


# ------------------------------------------------------------------ checks before any write
def check_folders(args):
    """--out and --ckpt-dir are folders that exist or can be made (every
    missing part below a writable folder), checked before anything is made."""
    for flag, path in (("--out", args.out), ("--ckpt-dir", args.ckpt_dir)):
        if path is None:
            continue
        if os.path.exists(path) and not os.path.isdir(path):
            raise TrainError(f"{flag} {path!r} is a file; expected a folder (made when missing)")
        existing = os.path.abspath(path)
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise TrainError(f"{flag} {path!r} cannot be made: {existing!r} is a file")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise TrainError(f"{flag} {path!r}: the folder {existing!r} is not writable")


def _memory_limit():
    """Bytes of memory this process may use: the machine's, or its cgroup's
    limit when lower; None when neither can be read."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        pass
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limits.append(int(f.read().strip()))       # "max" (no limit) is a ValueError
    except (OSError, ValueError):
        pass
    return min(limits) if limits else None


def memory_needed(args, vocab_size, dp_size):
    """A lower bound on the bytes a training step takes on one rank: float32
    parameters, gradients and optimizer state, and the activations backward
    keeps (GPT: per layer the attention probabilities, (H, T, T) a sequence,
    and the MLP's two 4C-wide outputs, 8 C a position; the logits and their
    softmax; MLP: each layer's output and its gradient).  Only used to refuse
    sizes that cannot fit, before any of it is allocated."""
    b = max(1, args.batch_size // dp_size)
    if args.model == "gpt":
        c = PRESETS[args.preset](block_size=args.block_size, vocab_size=vocab_size)
        T, C, L, H, V = c.block_size, c.n_embd, c.n_layer, c.n_head, c.vocab_size
        params = 12 * L * C * C + (V + T) * C
        activations = L * b * (H * T * T + 8 * T * C) + 2 * b * T * V
    else:
        sizes = (28 * 28, *MLP_PRESETS[args.preset], 10)
        params = sum(m * n for m, n in zip(sizes, sizes[1:]))
        activations = 2 * b * sum(sizes)
    states = 2 + (2 if args.optimizer == "adamw" else 1)
    if args.device != "cpu":     # the model is built on the host, the step runs on the device
        return 4 * params
    return 4 * (states * params + activations)


def _size(n):
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024


def check_sizes(args, data, world_size):
    """--block-size fits the corpus (a window and its next-token targets in
    both splits), and one step fits in memory."""
    if args.model == "gpt" and isinstance(data, CharCorpus):
        shortest = min(len(data.train), len(data.val))
        if shortest < 2:
            raise TrainError(f"corpus {args.data!r} is too short to train on: its shortest "
                             f"split has {shortest} token(s)")
        if args.block_size >= shortest:
            raise TrainError(f"--block-size {args.block_size} is too long for the corpus "
                             f"{data.name!r}: its shortest split has {shortest} tokens; "
                             f"expected at most {shortest - 1}")
    dp_size = parallel_layout.data_parallel_size(args.parallel, world_size, args.tp_size)
    vocab = getattr(data, "vocab_size", 0)
    need, have = memory_needed(args, vocab, dp_size), _memory_limit()
    if have is not None and need > have:
        flags = (f"--block-size {args.block_size} and --batch-size {args.batch_size}"
                 if args.model == "gpt" else f"--batch-size {args.batch_size}")
        lower = "--block-size or --batch-size" if args.model == "gpt" else "--batch-size"
        raise TrainError(f"{flags}: a training step of {args.model} {args.preset} needs at "
                         f"least {_size(need)} of memory per rank, more than the "
                         f"{_size(have)} here; lower {lower}")


def build_model(args, data):
    if args.model == "mlp":
        return MLP(hidden=MLP_PRESETS[args.preset]), {"hidden": list(MLP_PRESETS[args.preset])}
    overrides = {"vocab_size": data.vocab_size}
    if args.block_size is not None:
        overrides["block_size"] = args.block_size
    config = PRESETS[args.preset](**overrides)
    return GPT(config), config.to_dict()


def loss_of(model, x, y):
    out = model(x, y) if isinstance(_unwrap(model), GPT) else model(x)
    return out[1] if isinstance(out, tuple) else nn.functional.cross_entropy(out, y)


def _unwrap(model):
    return getattr(model, "module", model)


def build_optimizer(args, model):
    if args.optimizer == "sgd":
        return pyflow.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9,
                                weight_decay=args.weight_decay)
    # nanoGPT's split: matrices (Linear, Embedding) decay, biases and LayerNorm gains do not
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    return pyflow.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}],
                              lr=args.lr, betas=(0.9, 0.95))


AMP_DTYPES = {"bf16": pyflow.bfloat16, "fp16": pyflow.float16}


def autocast(amp, device):
    """The ``--amp`` autocast context for the forward pass and the loss (a
    disabled one for ``--amp none``)."""
    return pyflow.autocast(device, dtype=AMP_DTYPES.get(amp), enabled=amp != "none")


class TrainGraph(nn.Graph):
    """One training step (forward, backward, update, LR step) as a static graph."""

    def __init__(self, model, optimizer, scheduler, amp="none", scaler=None):
        super().__init__()
        self.model = model
        self.add_optimizer(optimizer, lr_sch=scheduler)
        # the forward is traced under autocast, with the casts it makes
        self.config.enable_amp(amp != "none", dtype=AMP_DTYPES.get(amp))
        if scaler is not None and scaler.is_enabled():
            self.set_grad_scaler(scaler)    # seeds the backward, steps and updates

    def build(self, x, y):
        loss = loss_of(self.model, x, y)
        loss.backward()
        return loss


class Batches:
    """The global batch of every step, drawn from one seeded generator (the same
    on every rank: its state is the data position), of which each rank keeps its
    own slice (with a ``layout``: its data-parallel group's slice, made global)."""

    def __init__(self, data, args, rank, world_size, layout=None):
        self.data, self.rank, self.world_size = data, rank, world_size
        self.layout = layout
        if layout is not None:          # the slice of this rank's data-parallel group
            self.rank, self.world_size = layout.dp_index, layout.dp_size
        self.batch, self.block = args.batch_size, args.block_size
        self.device = args.device
        self.generator = pyflow.Generator().manual_seed(args.seed)

    def _slice(self, x):
        per_rank = x.shape[0] // self.world_size
        return x[self.rank * per_rank:(self.rank + 1) * per_rank].contiguous()

    def next(self, split="train", generator=None):
        x, y = self.data.get_batch(split, self.batch, self.block, generator or self.generator)
        if self.world_size > 1:
            x, y = self._slice(x), self._slice(y)
        x, y = x.to(self.device), y.to(self.device)
        if self.layout is not None:
            x, y = self.layout.place(x), self.layout.place(y)
        return x, y


def _value(comm, loss):
    """A loss as a Python float, averaged over the ranks' slices (a global loss is
    already the whole batch's)."""
    if loss.is_global:
        return parallel_layout.whole(loss).item()
    return _mean_over_ranks(comm, loss.item())


def make_global(model, args, world_size):
    """Make the parameters global for --parallel (and graph-mode data parallel)
    and return their ``parallel_layout.Layout``; flags that make no layout are
    a TrainError, raised before anything moves.  Collective over every rank."""
    from pyflow.comm import world
    rank = world().rank
    if args.parallel != "dp" and args.model != "gpt":
        raise TrainError(f"--parallel {args.parallel} is defined for --model gpt (Megatron's "
                         f"MLP split); use --parallel dp for --model {args.model}")
    if args.parallel == "hybrid" and not parallel_layout.grid_fits(world_size, args.tp_size):
        raise TrainError(f"--parallel hybrid: {world_size} ranks do not form a grid with "
                         f"--tp-size {args.tp_size} ranks per row")
    layout = parallel_layout.plan(model, args.parallel, args.device, rank, world_size,
                                  args.tp_size)
    if args.batch_size % layout.dp_size:
        raise TrainError(f"--batch-size {args.batch_size} must be a multiple of the "
                         f"data-parallel size ({layout.dp_size})")
    parallel_layout.place_model(model, layout)
    return layout


def _mean_over_ranks(comm, value):
    if comm.size == 1:
        return value
    t = pyflow.tensor([value], dtype=pyflow.float64)
    comm.all_reduce(t)
    return t.item() / comm.size


def evaluate(model, batches, args, comm):
    """Mean held-out loss over ``--eval-iters`` batches, the same batches at
    every evaluation (their own generator), averaged over the ranks' slices."""
    generator = pyflow.Generator().manual_seed(args.seed + 1)
    model.eval()
    total = 0.0
    with pyflow.no_grad(), autocast(args.amp, args.device):
        for _ in range(args.eval_iters):
            x, y = batches.next("val", generator)
            total += _value(comm, loss_of(model, x, y))
    model.train()
    return total / args.eval_iters


# ------------------------------------------------------------------ checkpoints
def _run_info(args, model_config, data):
    info = {"model": args.model, "config": model_config, "optimizer": args.optimizer,
            "lr": args.lr, "weight_decay": args.weight_decay, "warmup": args.warmup,
            "steps": args.steps, "batch_size": args.batch_size, "data": data.name,
            "vocab": getattr(data, "vocab", None), "text": getattr(data, "digest", None)}
    if args.amp != "none":          # absent otherwise: older checkpoints still resume
        info["amp"] = args.amp
    return info


def _differences(saved, current, prefix=""):
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            shown = [v if not isinstance(v, str) or len(v) < 40 else f"<{len(v)} chars>"
                     for v in (a, b)]
            out.append(f"{prefix}{key} is {shown[0]!r} there, {shown[1]!r} here")
    return out


def load_checkpoint(path, run_info):
    """The checkpoint at ``path``, after checking it was written by the same run
    configuration (otherwise a TrainError naming every difference)."""
    try:
        ckpt = pyflow.load(path)
    except Exception as e:       # a damaged or foreign file: say which, in one line
        raise TrainError(f"cannot read checkpoint {path}: {e}") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("run"), dict):
        raise TrainError(f"{path} is not a checkpoint of pyflow-train")
    diff = _differences(ckpt["run"], run_info)
    if diff:
        raise TrainError(f"checkpoint {path} is incompatible with this run (nothing was "
                         f"changed): " + "; ".join(diff))
    return ckpt


def save_checkpoint(path, model, optimizer, scheduler, step, batches, run_info, write=True,
                    scaler=None):
    """Every rank calls it (gathering split global tensors is collective); the rank
    with ``write`` writes the file (with the loss scaler's state under --amp fp16)."""
    model_state = parallel_layout.local_state(model.state_dict())
    optimizer_state = parallel_layout.local_state(optimizer.state_dict())
    if not write:
        return
    state = {"model": model_state, "optimizer": optimizer_state,
             "scheduler": scheduler.state_dict(), "step": step,
             "rng": pyflow.get_rng_state(), "data_rng": batches.generator.get_state(),
             "run": run_info}
    if scaler is not None and scaler.is_enabled():
        state["scaler"] = scaler.state_dict()
    pyflow.save(state, path)


# ------------------------------------------------------------------ log and plot
class Log:
    """train_log.csv of rank 0 (a resumed run keeps the rows up to its step)."""

    def __init__(self, out, start_step):
        self.file = None
        if out is None:
            return
        os.makedirs(out, exist_ok=True)
        self.path = os.path.join(out, LOG_NAME)
        kept = []
        if start_step and os.path.exists(self.path):
            with open(self.path, newline="") as f:
                kept = [r for r in csv.DictReader(f) if int(r["step"]) <= start_step]
        self.file = open(self.path, "w", newline="")
        self.writer = csv.DictWriter(self.file, LOG_FIELDS)
        self.writer.writeheader()
        self.writer.writerows(kept)

    def write(self, **row):
        if self.file is not None:
            self.writer.writerow(row)
            self.file.flush()

    def close(self):
        if self.file is not None:
            self.file.close()


def plot(log_path, out):
    """loss.png from the CSV log; None (and why) when matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None, "matplotlib is not installed (pip install matplotlib): no loss.png"
    with open(log_path, newline="") as f:
        rows = list(csv.DictReader(f))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([int(r["step"]) for r in rows], [float(r["loss"]) for r in rows], label="train")
    val = [(int(r["step"]), float(r["val_loss"])) for r in rows if r["val_loss"]]
    if val:
        ax.plot(*zip(*val), "o-", label="held out")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend()
    path = os.path.join(out, PLOT_NAME)
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path, None


# ------------------------------------------------------------------ the run
class Job(types.SimpleNamespace):
    """What ``setup`` made for one run, shared by the loop and the report:
    ``args``, ``comm``, ``rank``, ``world_size``, ``ckpt_path`` (None without
    --ckpt-dir), ``model``, ``train_model`` (the model, or its DDP wrapper),
    ``graph`` (None in eager mode), ``optimizer``, ``scheduler``, ``batches``,
    ``run_info`` (what a checkpoint must match), ``start`` (the last step
    already done), ``n_params``, ``log`` and ``scaler`` (the GradScaler,
    enabled under --amp fp16)."""


class History:
    """What the loop measured: losses by step, held-out losses by step, the
    seconds of every step, and the steps run (``start`` + 1 .. ``stop``)."""

    def __init__(self, start, stop):
        self.start, self.stop = start, stop
        self.losses, self.val_losses, self.times = {}, {}, []

    @property
    def skip(self):
        """Steps left out of the throughput: the first ones compile kernels (and
        the graph); the last one is always kept."""
        return min(2, len(self.times) - 1) if self.times else 0


def run(args):
    """Train as ``args`` say; returns a summary dict (losses per step, held-out
    losses, samples/s).  Raises TrainError for a problem to report."""
    job = setup(args)
    history = train_loop(job)
    summary = summarize(job, history)
    if job.rank == 0:
        report(job.args, summary, history.skip, job.log)
    return summary


def setup(args):
    """Check everything that can be checked before a file is written (raising
    TrainError), settle the defaults that depend on the data (``args.steps``,
    ``args.warmup``, ``args.block_size`` are filled in), build the model, its
    layout, optimizer, scheduler and batches, resume the checkpoint, open the
    log and print the first line.  Returns the Job."""
    from pyflow.comm import world
    comm = world()
    rank, world_size = comm.rank, comm.size
    if args.batch_size % world_size:
        raise TrainError(f"--batch-size {args.batch_size} is the global batch and must be a "
                         f"multiple of the number of ranks ({world_size})")
    if args.device == "cuda" and not pyflow.cuda.is_available():
        raise TrainError("--device cuda: no CUDA device is available")
    check_folders(args)
    ckpt_path = os.path.join(args.ckpt_dir, CKPT_NAME) if args.ckpt_dir else None
    if ckpt_path and args.resume and not os.path.isfile(ckpt_path):
        raise TrainError(f"--resume: there is no checkpoint {ckpt_path} to continue")
    if ckpt_path and not args.resume and os.path.exists(ckpt_path):
        raise TrainError(f"{ckpt_path} already exists; pass --resume to continue it, or choose "
                         f"another --ckpt-dir (it is not overwritten)")
    from pyflow.distributed.env import get_local_world_size
    _share_cores(get_local_world_size())

    data = load_data(args, PRESETS[args.preset]().vocab_size if args.model == "gpt" else 0)
    _settle_lengths(args, data)
    check_sizes(args, data, world_size)

    pyflow.manual_seed(args.seed)
    model, model_config = build_model(args, data)
    model.to(args.device)
    layout = None
    if world_size > 1 and (args.graph or args.parallel != "dp"):
        layout = make_global(model, args, world_size)
    optimizer = build_optimizer(args, model)
    scheduler = pyflow.optim.lr_scheduler.LambdaLR(optimizer,
                                                   WarmupCosine(args.warmup, args.steps))
    batches = Batches(data, args, rank, world_size, layout)
    run_info = _run_info(args, model_config, data)
    scaler = pyflow.amp.GradScaler(args.device, enabled=args.amp == "fp16")
    start = 0
    if args.resume:
        ckpt = load_checkpoint(ckpt_path, run_info)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        pyflow.set_rng_state(ckpt["rng"])
        batches.generator.set_state(ckpt["data_rng"])
        if scaler.is_enabled():
            scaler.load_state_dict(ckpt["scaler"])
        start = int(ckpt["step"])
    if ckpt_path and rank == 0:
        os.makedirs(args.ckpt_dir, exist_ok=True)
        stale = remove_stale_temporaries(ckpt_path)    # left by saves that were killed
        if stale:
            print(f"removed {len(stale)} temporary file(s) of killed checkpoint saves from "
                  f"{args.ckpt_dir}", flush=True)

    # Global parameters carry their own layout; local ones on many ranks need
    # DDP to average the gradients.
    train_model = model
    if world_size > 1 and layout is None:
        from pyflow.nn.parallel import DistributedDataParallel
        train_model = DistributedDataParallel(model, comm=comm)
    graph = (TrainGraph(model, optimizer, scheduler, args.amp, scaler) if args.graph
             else None)
    n_params = sum(p.numel() for p in model.parameters())
    log = Log(args.out, start) if rank == 0 else Log(None, 0)
    if rank == 0:
        print(f"pyflow {pyflow.__version__}: {args.model} {args.preset} ({n_params:,} parameters) "
              f"on {data.name}, {'graph' if args.graph else 'eager'} mode, {world_size} rank(s), "
              f"global batch {args.batch_size}, steps {start + 1}..{args.steps}", flush=True)
    return Job(args=args, comm=comm, rank=rank, world_size=world_size, ckpt_path=ckpt_path,
               model=model, train_model=train_model, graph=graph, optimizer=optimizer,
               scheduler=scheduler, batches=batches, run_info=run_info, start=start,
               n_params=n_params, log=log, scaler=scaler)


def _settle_lengths(args, data):
    """Fill in the defaults that depend on the preset and the data: the block
    size, the steps (from --epochs when given) and the warm-up."""
    if args.model == "gpt" and args.block_size is None:
        args.block_size = PRESETS[args.preset]().block_size
    if args.steps is None:
        if args.epochs is not None:
            per_step = args.batch_size * (args.block_size if args.model == "gpt" else 1)
            size = len(data.train) if hasattr(data, "train") else 20000
            args.steps = max(1, args.epochs * size // per_step)
        else:
            args.steps = 200
    if args.warmup is None:
        args.warmup = min(100, args.steps // 10)
    if args.warmup >= args.steps:
        raise TrainError(f"--warmup {args.warmup} must be smaller than the number of steps "
                         f"({args.steps})")


def train_loop(job):
    """Run steps ``job.start + 1`` up to ``--steps`` (or ``--stop-after``):
    each step, the held-out loss when due, the log row, the progress bar and
    the checkpoint when due.  Closes the log; returns the History."""
    args, rank = job.args, job.rank
    progress = None
    if rank == 0 and not args.no_progress:
        from tqdm import tqdm
        progress = tqdm(total=args.steps, initial=job.start, desc="train", unit="step",
                        dynamic_ncols=True)
    say = progress.write if progress is not None else print
    history = History(job.start, min(args.steps, args.stop_after or args.steps))
    for step in range(job.start + 1, history.stop + 1):
        lr = job.optimizer.param_groups[0]["lr"]
        t0 = time.perf_counter()
        loss = _step(job)
        dt = time.perf_counter() - t0
        history.times.append(dt)
        history.losses[step] = loss
        val = None
        if step == args.steps or (args.eval_every and step % args.eval_every == 0):
            val = history.val_losses[step] = evaluate(job.model, job.batches, args, job.comm)
            if rank == 0:
                say(f"step {step}: train loss {loss:.4f}  held-out loss {val:.4f}")
        job.log.write(step=step, loss=f"{loss:.6f}", lr=f"{lr:.6g}",
                      samples_per_s=f"{args.batch_size / dt:.2f}",
                      val_loss="" if val is None else f"{val:.6f}")
        if progress is not None:
            progress.set_postfix(loss=f"{loss:.4f}", samples_s=f"{args.batch_size / dt:.1f}",
                                 refresh=False)
            progress.update(1)
        if job.ckpt_path and (step == args.steps
                              or (args.ckpt_every and step % args.ckpt_every == 0)):
            save_checkpoint(job.ckpt_path, job.model, job.optimizer, job.scheduler, step,
                            job.batches, job.run_info, write=rank == 0, scaler=job.scaler)
            job.comm.barrier()
    if progress is not None:
        progress.close()
    job.log.close()
    return history


def _step(job):
    """One training step on the next batch: returns its loss as a float, the
    whole global batch's (averaged over the ranks: collective)."""
    x, y = job.batches.next()
    if job.graph is not None:
        loss = job.graph(x, y)
    else:
        with autocast(job.args.amp, job.args.device):
            loss = loss_of(job.train_model, x, y)
        job.optimizer.zero_grad(set_to_none=True)
        scaler = job.scaler                 # disabled (a pass-through) but under --amp fp16
        scaler.scale(loss).backward()
        scaler.step(job.optimizer)          # skipped when a gradient overflowed
        scaler.update()
        job.scheduler.step()
    return _value(job.comm, loss)


def summarize(job, history):
    """The summary dict ``run`` returns: losses and held-out losses by step,
    samples/s after ``history.skip`` steps, the steps run, ranks, parameters."""
    timed = history.times[history.skip:]
    samples_per_s = job.args.batch_size * len(timed) / sum(timed) if timed else float("nan")
    return {"losses": history.losses, "val_losses": history.val_losses,
            "samples_per_s": samples_per_s, "start": history.start, "stop": history.stop,
            "world_size": job.world_size, "n_params": job.n_params}


def report(args, summary, skip, log):
    """Rank 0's last lines: held-out loss first -> last, final numbers, log and plot."""
    losses, val_losses, stop = summary["losses"], summary["val_losses"], summary["stop"]
    if not losses:
        print(f"nothing to do: the checkpoint is at step {summary['start']} of {args.steps}")
        return
    if val_losses:
        first, last = min(val_losses), max(val_losses)
        print(f"held-out loss {val_losses[first]:.4f} (step {first}) -> "
              f"{val_losses[last]:.4f} (step {last})")
    held_out = f"held-out loss {val_losses[stop]:.4f}  " if stop in val_losses else ""
    print(f"final: step {stop}  train loss {losses[stop]:.4f}  {held_out}"
          f"{summary['samples_per_s']:,.1f} samples/s (global batch {args.batch_size}, "
          f"{summary['world_size']} rank(s), timed after the first {skip} steps)")
    if args.out is not None:
        path, why = plot(log.path, args.out)
        print(f"log {log.path}; " + (f"plot {path}" if path else why))


def main(argv=None):
    """Entry point of ``pyflow-train``: 0 on success, 2 on a reported error."""
    args = parse_args(argv)
    try:
        run(args)
    except TrainError as e:
        print(f"pyflow-train: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
