"""Fused ops against the unfused ops they replace, and against PyTorch.

Each case is one training use, forward and backward (``y.backward(g)``, every
input requiring grad), on float32 tensors of a transformer's sizes (ROWS x
COLS activations).  In pyflow's child process the fused op and the same
arithmetic written as separate ops are timed alternately (medians of
``--repeats``); PyTorch's child times PyTorch's own way to write it (its
fused op where it has one: ``F.rms_norm``, ``F.cross_entropy``; else the
composition, which is what a PyTorch user runs on a CPU).  The two children
alternate for ``--rounds`` rounds (bench/common.py says why one library per
process); the table shows medians over rounds.

Targets (issue 18): a fused op at least 1.5x its unfused composition on the
memory-bound chains (bias + GELU, bias + dropout + residual, add + layer norm,
cross-entropy); the others are shown without a target.

Run: python bench/fused_ops.py [--rounds 3] [--repeats 7] [--rows 4096] [--cols 1024]
     [--results bench/RESULTS.md]  (also writes the table there, as its "## Fused ops")
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench.common import (emit_result, interleaved, machine_in_child, run_child,  # noqa
                          table, write_section)

ENV_AT_START = dict(os.environ)
SECTION = "## Fused ops"
TARGET = 1.5
TARGETED = ("bias + GELU", "bias + dropout + residual", "add + layer_norm", "cross_entropy")
HEADERS = ["case (float32, fwd+bwd)", "fused ms", "unfused ms", "unfused/fused", "torch ms",
           "pyflow fused/torch time", "target", "met"]


# ------------------------------------------------------------------ the cases
def cases(lib, rows, cols):
    """{case: (fused or None, unfused)}: functions of no arguments running one
    forward and backward in ``lib`` (pyflow or torch).  For torch ``fused`` is its
    own fused op where it has one, else None (its row then times the composition)."""
    import numpy as np
    F = lib.nn.functional
    is_pyflow = lib.__name__ == "pyflow"
    rng = np.random.default_rng(0)

    def t(*shape, grad=True):
        return lib.tensor(rng.standard_normal(shape).astype(np.float32), requires_grad=grad)

    x, r, g = t(rows, cols), t(rows, cols), t(rows, cols, grad=False)
    b, w, w2 = t(cols), t(cols), t(cols)
    heads, seq = 8, 128
    scores = t(max(1, rows * cols // (heads * seq * seq)), heads, seq, seq)   # x's elements
    mask = lib.tensor(np.tril(np.ones((seq, seq), bool)))
    gs = lib.tensor(rng.standard_normal(tuple(scores.shape)).astype(np.float32))
    vocab = 8 * cols
    logits = t(rows // 2, vocab)
    target = lib.tensor(rng.integers(0, vocab, rows // 2))
    inputs = (x, r, b, w, w2, scores, logits)

    def run(fn, grad):
        def step():
            for a in inputs:
                a.grad = None
            fn().backward(grad)
        return step

    def seeded(fn):
        def call():
            lib.manual_seed(0)
            return fn()
        return call

    def add_ln_sum(out_and_sum):
        out, s = out_and_sum
        return out + s          # both outputs reach the loss, as in a pre-LN block

    def rms_ops():
        return x * (x * x).mean(-1, keepdim=True).add(1e-6).rsqrt() * w

    def smsm_ops():
        return F.softmax(scores.masked_fill(~mask, float("-inf")) * 0.125, -1)

    chains = {
        "bias + GELU": (
            (lambda: F.fused_bias_add_gelu(x, b)) if is_pyflow else None,
            lambda: F.gelu(x + b), g),
        "bias + dropout + residual": (
            seeded(lambda: F.fused_bias_dropout_add(x, b, r, p=0.1)) if is_pyflow else None,
            seeded(lambda: F.dropout(x + b, 0.1) + r), g),
        "add + layer_norm": (
            (lambda: add_ln_sum(F.fused_add_layer_norm(x, r, (cols,), w, w2)))
            if is_pyflow else None,
            lambda: add_ln_sum((F.layer_norm(x + r, (cols,), w, w2), x + r)), g),
        "rms_norm": (
            lambda: F.rms_norm(x, (cols,), w, 1e-6),
            rms_ops, g),
        "scale + mask + softmax": (
            (lambda: F.fused_scale_mask_softmax(scores, mask, 0.125)) if is_pyflow else None,
            smsm_ops, gs),
        "cross_entropy": (
            lambda: F.cross_entropy(logits, target) * 1.0,
            lambda: F.nll_loss(F.log_softmax(logits, -1), target) * 1.0, None),
    }
    return {name: (fused and run(fused, grad), run(unfused, grad))
            for name, (fused, unfused, grad) in chains.items()}


def child(lib_name, args):
    import importlib
    lib = importlib.import_module(lib_name)
    if lib_name == "torch":
        lib.set_num_threads(os.cpu_count())
    out = {}
    for name, (fused, unfused) in cases(lib, args.rows, args.cols).items():
        fns = [unfused] if fused is None else [fused, unfused]
        times = interleaved(fns, repeats=args.repeats, warmup=2)
        out[name] = {"fused": times[0] if fused is not None else None, "unfused": times[-1]}
    return out


# ------------------------------------------------------------------ the parent
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--child", choices=("pyflow", "torch"))
    parser.add_argument("--results", help="also write the table into this Markdown file "
                                          "(bench/RESULTS.md), replacing its section")
    args = parser.parse_args(argv)
    if args.child:
        emit_result(lambda: child(args.child, args))
        return
    runs = {"pyflow": [], "torch": []}
    base = [os.path.abspath(__file__), "--repeats", str(args.repeats), "--rows", str(args.rows),
            "--cols", str(args.cols), "--child"]
    for k in range(args.rounds):
        for lib in (("pyflow", "torch") if k % 2 == 0 else ("torch", "pyflow")):
            res = run_child(base + [lib], env=ENV_AT_START, what=f"{lib} child")
            if "error" in res:
                raise SystemExit(f"{lib}: {res['error']}")
            runs[lib].append(res)
    med = lambda lib, name, key: statistics.median(r[name][key] for r in runs[lib])
    rows = []
    for name in runs["pyflow"][0]:
        fused, unfused = med("pyflow", name, "fused"), med("pyflow", name, "unfused")
        tkey = "fused" if runs["torch"][0][name]["fused"] is not None else "unfused"
        torch_t = med("torch", name, tkey)
        speedup = unfused / fused
        targeted = name in TARGETED
        rows.append([name + ("" if tkey == "unfused" else " (torch fused)"),
                     f"{fused * 1e3:.2f}", f"{unfused * 1e3:.2f}", f"{speedup:.2f}x",
                     f"{torch_t * 1e3:.2f}", f"{fused / torch_t:.2f}x",
                     f">= {TARGET}x" if targeted else "-",
                     ("yes" if speedup >= TARGET else "no") if targeted else "-"])
    text = (f"{SECTION}\n\n`python bench/fused_ops.py --rounds {args.rounds}`, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {args.rows}x{args.cols} "
            f"float32 activations, forward+backward; {machine_in_child(ENV_AT_START)}. Medians "
            f"of {args.rounds} rounds (each the median of {args.repeats}), pyflow and torch "
            f"in alternating child processes.\n\n{table(rows, HEADERS)}\n")
    print(text)
    if args.results:
        write_section(args.results, SECTION, text)


if __name__ == "__main__":
    main()
