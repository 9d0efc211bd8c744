"""models/data.py and models/train.py: the corpus and batches, a short run
that converges, kill (``--stop-after``) and ``--resume`` reproducing the
uninterrupted losses in eager and graph mode, clear errors that overwrite
nothing, and ``--parallel dp`` on 2 ranks equal to one rank on the same global
batch.

In-process runs call ``train.run``; runs that must be separate processes
(MPI ranks, exit codes) go through the launcher like tests/distributed."""
import csv
import hashlib
import math
import os
import subprocess
import sys

import numpy as np
import pytest

import pyflow as pf
from pyflow.models import data as data_mod
from pyflow.models import train
from pyflow.models.data import CharCorpus, SyntheticTokens

from ..distributed.test_distributed import pyflow_run
from ..helpers import to_numpy

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_PY = os.path.join(ROOT, "models", "train.py")
# A small run on a fixed text (the project's corpus changes whenever its sources do).
FAST = ["--block-size", "16", "--batch-size", "8", "--eval-iters", "2", "--no-progress"]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "text.txt"
    rng = np.random.default_rng(0)
    words = ["actor", "register", "graph", "tensor", "kernel", "boxing", "rank", "numba"]
    path.write_text(" ".join(rng.choice(words, 3000)) + "\n", encoding="utf-8")
    return str(path)


def run(*argv):
    return train.run(train.parse_args([str(a) for a in argv]))


def read_log(out):
    with open(os.path.join(out, train.LOG_NAME), newline="") as f:
        return list(csv.DictReader(f))


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


# ---------------------------------------------------------------- data
def test_project_corpus_is_the_shipped_text_in_a_fixed_order():
    files = data_mod.project_text_files()
    rel = [os.path.relpath(f, ROOT) for f in files]
    assert rel[0] == "README.md" and rel[1].startswith("docs" + os.sep)
    assert os.path.join("models", "data.py") in rel and os.path.join("pyflow", "tensor.py") in rel
    assert files == data_mod.project_text_files()
    assert not any("__pycache__" in f for f in rel)
    corpus = CharCorpus.from_project()
    assert corpus.vocab == "".join(sorted(set(corpus.vocab))) and "\n" in corpus.vocab
    n = len(corpus.train) + len(corpus.val)
    assert len(corpus.train) == int(n * 0.9) and n > 100_000


def test_char_corpus_batches(text_file):
    corpus = CharCorpus.from_file(text_file)
    with open(text_file, encoding="utf-8") as f:
        text = f.read()
    assert corpus.vocab == "".join(sorted(set(text)))
    assert corpus.decode(corpus.train[:40]) == text[:40]
    assert corpus.encode("graph") == [corpus.vocab.index(c) for c in "graph"]
    x, y = corpus.get_batch("val", 5, 7, pf.Generator().manual_seed(1))
    assert x.dtype == pf.int64 and tuple(x.shape) == (5, 7) == tuple(y.shape)
    xs, ys = to_numpy(x), to_numpy(y)
    assert np.array_equal(xs[:, 1:], ys[:, :-1])              # targets: the next characters
    for row in xs:                                            # every row is a window of val
        start = np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(
            corpus.val, 7) == row, axis=1))
        assert len(start)
    x2, _ = corpus.get_batch("val", 5, 7, pf.Generator().manual_seed(1))
    assert np.array_equal(to_numpy(x2), xs)                   # the generator is the position
    s, t = SyntheticTokens(13).get_batch("train", 4, 6, pf.Generator().manual_seed(2))
    assert 0 <= to_numpy(s).min() and to_numpy(s).max() < 13
    assert np.array_equal(to_numpy(s)[:, 1:], to_numpy(t)[:, :-1])


def test_data_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="corpus '.*nope.txt' does not exist"):
        CharCorpus.from_file(str(tmp_path / "nope.txt"))
    corpus = CharCorpus("abcabcabcabcabcabcabc")
    with pytest.raises(ValueError, match="split must be 'train' or 'val', got 'test'"):
        corpus.get_batch("test", 2, 4)
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        corpus.get_batch("train", 0, 4)
    with pytest.raises(ValueError, match="val split of .* has 3 tokens, too few for block_size 8"):
        corpus.get_batch("val", 2, 8)


def test_warmup_cosine_schedule():
    f = train.WarmupCosine(warmup=4, total=20, min_ratio=0.1)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert f(4) == 1.0 and math.isclose(f(12), 0.55) and math.isclose(f(20), 0.1)
    values = [f(s) for s in range(4, 21)]
    assert all(a >= b for a, b in zip(values, values[1:]))


# ---------------------------------------------------------------- training
def test_short_run_on_the_project_corpus_converges(tmp_path, capsys):
    out = tmp_path / "out"
    summary = run("--steps", 60, "--lr", 3e-3, "--eval-every", 30, "--eval-iters", 4,
                  "--block-size", 32, "--no-progress", "--out", out)
    losses = summary["losses"]
    assert losses[1] > 4.0                                    # ~ln(95) at the start
    assert np.mean([losses[s] for s in range(51, 61)]) < losses[1] - 1.0
    assert summary["val_losses"][60] < summary["val_losses"][30] < 4.0
    rows = read_log(out)
    assert [int(r["step"]) for r in rows] == list(range(1, 61))
    assert float(rows[0]["lr"]) == pytest.approx(3e-3 / 6)   # warm-up: a tenth of the steps
    assert [r["val_loss"] != "" for r in rows].count(True) == 2
    printed = capsys.readouterr().out
    assert "final: step 60" in printed and "samples/s" in printed and "held-out loss" in printed


def test_mlp_on_synthetic_data(capsys):
    summary = run("--model", "mlp", "--data", "synthetic", "--steps", 3, "--batch-size", 16,
                  "--optimizer", "sgd", "--eval-iters", 1, "--no-progress")
    assert sorted(summary["losses"]) == [1, 2, 3]
    assert all(np.isfinite(v) for v in summary["losses"].values())


@pytest.mark.parametrize("mode", [["--eager"], ["--graph"], ["--eager", "--amp", "fp16"],
                                  ["--graph", "--amp", "fp16"]],
                         ids=["eager", "graph", "eager-fp16", "graph-fp16"])
def test_stop_and_resume_reproduce_the_uninterrupted_losses(tmp_path, text_file, mode):
    common = ["--data", text_file, "--steps", 6, "--warmup", 2, "--eval-every", 3,
              "--ckpt-every", 2, *mode, *FAST]
    full = run(*common, "--ckpt-dir", tmp_path / "full", "--out", tmp_path / "full_out")
    ckpt = tmp_path / "cut"
    first = run(*common, "--ckpt-dir", ckpt, "--out", tmp_path / "cut_out", "--stop-after", 3)
    assert sorted(first["losses"]) == [1, 2, 3]               # killed after step 3: ckpt at 2
    assert pf.load(str(ckpt / train.CKPT_NAME))["step"] == 2
    second = run(*common, "--ckpt-dir", ckpt, "--out", tmp_path / "cut_out", "--resume")
    assert second["start"] == 2 and sorted(second["losses"]) == [3, 4, 5, 6]
    for step in range(3, 7):
        assert second["losses"][step] == full["losses"][step], step
    assert second["val_losses"] == full["val_losses"]
    def rows(out):
        return [(r["step"], r["loss"], r["lr"], r["val_loss"]) for r in read_log(tmp_path / out)]
    assert rows("cut_out") == rows("full_out")                              # the log, too, as if never cut
    resumed = pf.load(str(ckpt / train.CKPT_NAME))
    final = pf.load(str(tmp_path / "full" / train.CKPT_NAME))
    assert resumed["step"] == final["step"] == 6
    for name, value in final["model"].items():
        assert np.array_equal(to_numpy(resumed["model"][name]), to_numpy(value)), name
    assert ("scaler" in final) == ("fp16" in mode)         # the loss scale is resumed too
    if "fp16" in mode:
        assert resumed["scaler"] == final["scaler"]


def _tail_loss(summary, n=20):
    losses = summary["losses"]
    return float(np.mean([losses[s] for s in sorted(losses)[-n:]]))


def test_mixed_precision_training_tracks_float32(text_file):
    """300 steps of the tiny GPT under --amp bf16 (autocast) and --amp fp16
    (autocast + loss scaling) end within 0.15 of float32's loss (the mean of
    the last 20 steps; measured gaps 0.03-0.09 on this corpus and on the
    project's), all three well below the start."""
    common = ["--data", text_file, "--steps", 300, "--lr", 3e-3, "--eval-every", 0, *FAST]
    fp32 = run(*common)
    start = fp32["losses"][1]
    for amp in ("bf16", "fp16"):
        mixed = run(*common, "--amp", amp)
        assert mixed["losses"][1] == pytest.approx(start, abs=0.01), amp
        assert abs(_tail_loss(mixed) - _tail_loss(fp32)) < 0.15, (amp, _tail_loss(mixed),
                                                                  _tail_loss(fp32))
        assert _tail_loss(mixed) < start - 1.0, amp
        assert mixed["losses"][300] != fp32["losses"][300], amp     # autocast did run


@pytest.mark.parametrize("amp", ["bf16", "fp16"])
def test_mixed_precision_graph_steps_equal_eager(text_file, amp):
    """The graph traces under autocast (config.enable_amp) and, under fp16, does
    the loss scaler's steps (set_grad_scaler): the same losses as eager."""
    common = ["--data", text_file, "--steps", 5, "--warmup", 1, "--eval-every", 0, "--amp",
              amp, *FAST]
    eager, graph = run(*common, "--eager"), run(*common, "--graph")
    for step in range(1, 6):
        assert graph["losses"][step] == pytest.approx(eager["losses"][step], rel=1e-5), step


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("argv, message", [
    (["--optimizer", "rmsprop"], "argument --optimizer: invalid choice: 'rmsprop'"),
    (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
    (["--lr", "-1"], "argument --lr: must be a positive number, got -1"),
    (["--preset", "huge"], "--preset 'huge' is not a gpt preset"),
    (["--resume"], "--resume needs --ckpt-dir"),
    (["--model", "mlp", "--data", "chars"], "--model mlp trains on --data digits or synthetic"),
    (["--steps", "3", "--epochs", "1"], "argument --epochs: not allowed with argument --steps"),
    (["--amp", "fp8"], "argument --amp: invalid choice: 'fp8'"),
])
def test_bad_flags_exit_with_a_clear_message(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_missing_corpus_exits_non_zero(tmp_path, capsys):
    assert train.main(["--data", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "pyflow-train: error: corpus" in err and "missing.txt' does not exist" in err
    assert not os.path.exists(tmp_path / "o")                 # nothing written


def test_incompatible_or_existing_checkpoint_is_never_overwritten(tmp_path, text_file, capsys):
    ckpt_dir = tmp_path / "ck"
    base = ["--data", text_file, "--steps", 2, "--eval-every", 0, "--eval-iters", 1,
            "--ckpt-dir", ckpt_dir, "--no-progress", "--batch-size", 4]
    run(*base, "--block-size", 16)
    path = str(ckpt_dir / train.CKPT_NAME)
    before = digest(path)
    capsys.readouterr()
    cases = [
        ([*base, "--block-size", 8, "--resume"],
         "is incompatible with this run (nothing was changed): config.block_size is 16 there, "
         "8 here"),
        ([*base, "--block-size", 16, "--resume", "--optimizer", "sgd"],
         "optimizer is 'adamw' there, 'sgd' here"),
        ([*base, "--block-size", 16], "already exists; pass --resume to continue it"),
        ([*base, "--block-size", 16, "--resume", "--ckpt-dir", tmp_path / "empty"],
         "--resume: there is no checkpoint"),
    ]
    for argv, message in cases:
        assert train.main([str(a) for a in argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err, err
        assert digest(path) == before
    with open(tmp_path / "junk.safetensors", "wb") as f:
        f.write(b"not a checkpoint")
    os.makedirs(tmp_path / "junk", exist_ok=True)
    os.replace(tmp_path / "junk.safetensors", tmp_path / "junk" / train.CKPT_NAME)
    assert train.main([str(a) for a in [*base, "--ckpt-dir", tmp_path / "junk", "--resume"]]) == 2
    assert "cannot read checkpoint" in capsys.readouterr().err


def test_command_line_exit_codes(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT)
    ok = subprocess.run([sys.executable, "-m", "pyflow.models.train", "--help"],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0 and "--ckpt-every" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "pyflow.models.train", "--data",
                          str(tmp_path / "none.txt")], capture_output=True, text=True,
                         env=env, timeout=120)
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    assert "Traceback" not in bad.stderr


# ---------------------------------------------------------------- data parallel
@pytest.mark.cpu_only
def test_data_parallel_on_two_ranks_equals_one_rank_eager_and_graph(tmp_path, text_file):
    args = ["--data", text_file, "--steps", "3", "--warmup", "1", "--eval-every", "0",
            "--eval-iters", "2", "--block-size", "16", "--batch-size", "8"]
    single = run(*args, "--no-progress")
    proc = pyflow_run(2, TRAIN_PY, *args, "--out", str(tmp_path / "dp"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 rank(s)" in proc.stdout and "samples_s=" in proc.stderr     # rank 0's progress bar
    rows = read_log(tmp_path / "dp")
    for row in rows:
        assert float(row["loss"]) == pytest.approx(single["losses"][int(row["step"])], abs=2e-6)
    assert float(rows[-1]["val_loss"]) == pytest.approx(single["val_losses"][3], abs=2e-6)
    # graph mode: global tensors (parameters broadcast, batch split), same losses
    graph = pyflow_run(2, TRAIN_PY, *args, "--graph", "--no-progress",
                       "--out", str(tmp_path / "graph_dp"))
    assert graph.returncode == 0, graph.stdout + graph.stderr
    rows = read_log(tmp_path / "graph_dp")
    for row in rows:
        assert float(row["loss"]) == pytest.approx(single["losses"][int(row["step"])], abs=2e-6)
    assert float(rows[-1]["val_loss"]) == pytest.approx(single["val_losses"][3], abs=2e-6)


@pytest.mark.cpu_only
def test_sigkill_then_resume(tmp_path, text_file):
    """A real kill -9 mid-run: the atomic checkpoint it left resumes to the
    losses of an uninterrupted run."""
    import signal
    import time
    argv = ["--data", text_file, "--steps", "30", "--warmup", "5", "--eval-every", "0",
            "--eval-iters", "1", "--ckpt-every", "3", *FAST]
    full = run(*argv, "--ckpt-dir", tmp_path / "full")
    ckpt_dir = tmp_path / "killed"
    path = ckpt_dir / train.CKPT_NAME
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "pyflow.models.train", *argv,
                             "--ckpt-dir", str(ckpt_dir)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    step = pf.load(str(path))["step"]
    # killed as soon as its first checkpoint (step 3) appeared: 27 steps remained
    assert step < 30, "the run finished before it could be killed; the test checked nothing"
    resumed = run(*argv, "--ckpt-dir", ckpt_dir, "--resume")
    assert resumed["start"] == step and step % 3 == 0
    for s in range(step + 1, 31):
        assert resumed["losses"][s] == full["losses"][s], s
    assert os.listdir(ckpt_dir) == [train.CKPT_NAME]     # a killed save's file is collected


@pytest.mark.cpu_only
def test_tensor_and_hybrid_parallel_equal_one_rank_and_resume(tmp_path, text_file):
    """--parallel tp (Megatron's MLP split, eager, 2 ranks) and --parallel hybrid
    (a 2x2 grid, graph mode, 4 ranks, killed after step 2 and resumed) give the
    one-rank losses."""
    args = ["--data", text_file, "--steps", "4", "--warmup", "1", "--eval-every", "0",
            "--eval-iters", "2", "--block-size", "16", "--batch-size", "8", "--no-progress"]
    single = run(*args)
    tp = pyflow_run(2, TRAIN_PY, *args, "--parallel", "tp", "--out", str(tmp_path / "tp"))
    assert tp.returncode == 0, tp.stdout + tp.stderr
    ck = ["--graph", "--parallel", "hybrid", "--out", str(tmp_path / "hy"),
          "--ckpt-dir", str(tmp_path / "hy" / "ck"), "--ckpt-every", "2"]
    first = pyflow_run(4, TRAIN_PY, *args, *ck, "--stop-after", "2")
    assert first.returncode == 0, first.stdout + first.stderr
    resumed = pyflow_run(4, TRAIN_PY, *args, *ck, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    for out in ("tp", "hy"):
        rows = read_log(tmp_path / out)
        assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
        for row in rows:
            assert float(row["loss"]) == pytest.approx(single["losses"][int(row["step"])],
                                                       abs=2e-6), out


def test_tensor_parallel_is_for_gpt():
    args = train.parse_args(["--model", "mlp", "--parallel", "tp"])
    model, _ = train.build_model(args, None)
    with pytest.raises(train.TrainError, match="--parallel tp is defined for --model gpt"):
        train.make_global(model, args, 2)


def test_loss_plot_is_written(tmp_path):
    """The end-of-run plot (matplotlib, the ``plot`` extra that ``make`` installs)."""
    pytest.importorskip("matplotlib")
    from models import train
    log = tmp_path / "train_log.csv"
    log.write_text("step,loss,lr,samples_per_s,val_loss\n1,4.0,0.001,10,\n2,3.0,0.001,10,3.5\n")
    path, why = train.plot(str(log), str(tmp_path))
    assert why is None and path == str(tmp_path / "loss.png")
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
