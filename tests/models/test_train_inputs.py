"""The trainer's bad inputs: every one is one line ``pyflow-train: error:
...`` naming the flag and what was expected, exit status 2, in well under a
second of work, and nothing written (no half-made --out or --ckpt-dir)."""
import os
import subprocess
import sys
import time

import pytest

import pyflow as pf
from pyflow.models import train
from pyflow.utils import serialization

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PREFIX = "pyflow-train: error: "


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpora")
    (d / "text.txt").write_text("the actor graph boxes the tensor. " * 200, encoding="utf-8")
    (d / "short.txt").write_text("hello world\n", encoding="utf-8")
    (d / "empty.txt").write_text("", encoding="utf-8")
    (d / "a_file").write_text("x", encoding="utf-8")
    return d


def _main(argv):
    """The exit status of the trainer's entry point, run in this process."""
    try:
        return train.main([str(a) for a in argv])
    except SystemExit as e:     # argparse's errors
        return e.code


BAD = {
    # flag values
    "weight_decay_nan": (["--weight-decay", "nan"], "argument --weight-decay: must be a finite "
                                                    "number >= 0, got nan"),
    "weight_decay_negative": (["--weight-decay", "-0.5"], "--weight-decay: must be a finite"),
    "weight_decay_inf": (["--weight-decay", "inf"], "--weight-decay: must be a finite"),
    "weight_decay_text": (["--weight-decay", "lots"], "--weight-decay: must be a number"),
    "lr_nan": (["--lr", "nan"], "argument --lr: must be a positive number, got nan"),
    "lr_zero": (["--lr", "0"], "argument --lr: must be a positive number"),
    "lr_inf": (["--lr", "inf"], "argument --lr: must be a positive number"),
    "steps_zero": (["--steps", "0"], "argument --steps: must be >= 1, got 0"),
    "steps_negative": (["--steps", "-3"], "argument --steps: must be >= 1, got -3"),
    "steps_fraction": (["--steps", "2.5"], "argument --steps: must be an integer, got '2.5'"),
    "epochs_zero": (["--epochs", "0"], "argument --epochs: must be >= 1"),
    "batch_zero": (["--batch-size", "0"], "argument --batch-size: must be >= 1"),
    "block_zero": (["--block-size", "0"], "argument --block-size: must be >= 1"),
    "warmup_negative": (["--warmup", "-1"], "argument --warmup: must be >= 0"),
    "eval_iters_zero": (["--eval-iters", "0"], "argument --eval-iters: must be >= 1"),
    "tp_size_zero": (["--tp-size", "0"], "argument --tp-size: must be >= 1"),
    "seed_negative": (["--seed", "-1"], "argument --seed: must be >= 0"),
    "unknown_preset": (["--preset", "huge"], "--preset 'huge' is not a gpt preset"),
    "unknown_model": (["--model", "rnn"], "argument --model: invalid choice: 'rnn'"),
    "unknown_flag": (["--learning-rate", "1"], "unrecognized arguments: --learning-rate"),
    "warmup_over_steps": (["--steps", "3", "--warmup", "3", "--data", "synthetic"],
                          "--warmup 3 must be smaller than the number of steps (3)"),
    # the corpus
    "missing_corpus": (["--data", "{d}/nope.txt"], "corpus '{d}/nope.txt' does not exist"),
    "corpus_is_a_folder": (["--data", "{d}"], "corpus '{d}' is not a file"),
    "empty_corpus": (["--data", "{d}/empty.txt"], "corpus '{d}/empty.txt' holds no text"),
    "corpus_shorter_than_block": (["--data", "{d}/short.txt", "--block-size", "16"],
                                  "--block-size 16 is too long for the corpus 'short.txt': its "
                                  "shortest split has 2 tokens; expected at most 1"),
    "block_beyond_project_corpus": (["--block-size", "10000000"], "--block-size 10000000 is "
                                                                  "too long for the corpus"),
    # sizes that cannot fit: refused before anything is allocated
    "huge_block": (["--data", "synthetic", "--block-size", "100000000", "--batch-size", "1"],
                   "--block-size 100000000 and --batch-size 1: a training step of gpt tiny "
                   "needs at least"),
    "huge_batch": (["--data", "{d}/text.txt", "--block-size", "8", "--batch-size",
                    "1000000000000"], "lower --block-size or --batch-size"),
    "huge_mlp_batch": (["--model", "mlp", "--batch-size", "1000000000000"],
                       "--batch-size 1000000000000: a training step of mlp tiny needs at least"),
    # folders
    "ckpt_dir_is_a_file": (["--ckpt-dir", "{d}/a_file", "--data", "synthetic"],
                           "--ckpt-dir '{d}/a_file' is a file; expected a folder"),
    "out_is_a_file": (["--out", "{d}/a_file", "--data", "synthetic"],
                      "--out '{d}/a_file' is a file; expected a folder"),
    "out_below_a_file": (["--out", "{d}/a_file/run", "--data", "synthetic"],
                         "--out '{d}/a_file/run' cannot be made: '{d}/a_file' is a file"),
    "resume_without_checkpoint": (["--ckpt-dir", "{o}/ck", "--resume", "--data", "synthetic"],
                                  "--resume: there is no checkpoint"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, corpora, tmp_path, capsys):
    argv, message = BAD[case]
    fill = {"d": str(corpora), "o": str(tmp_path)}
    argv = [a.format(**fill) for a in argv]
    message = message.format(**fill)
    out_dirs = []
    if "--out" not in argv:
        argv += ["--out", str(tmp_path / "out")]
        out_dirs.append(tmp_path / "out")
    if "--ckpt-dir" not in argv:
        argv += ["--ckpt-dir", str(tmp_path / "ck")]
        out_dirs.append(tmp_path / "ck")
    before = sorted(os.listdir(corpora))
    t0 = time.perf_counter()
    code = _main(argv + ["--no-progress"])
    elapsed = time.perf_counter() - t0
    captured = capsys.readouterr()
    assert code == 2, (code, captured.err)
    assert captured.err.startswith(PREFIX) and captured.err.count("\n") == 1, captured.err
    assert message in captured.err, captured.err
    assert captured.out == ""
    assert not any(d.exists() for d in out_dirs) and not (tmp_path / "ck").exists()
    assert sorted(os.listdir(corpora)) == before
    assert elapsed < 30, f"{case} took {elapsed:.1f} s to be refused"


def test_command_line_errors_are_one_line_without_a_traceback(corpora, tmp_path):
    """As a user runs it: a flag error (argparse's own usage block is not
    printed) and the huge --block-size that used to end in a MemoryError
    after 12 s."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    for argv, message in ([["--weight-decay", "nan"], "argument --weight-decay"],
                          [["--block-size", "1000000000", "--data", "synthetic"],
                           "--block-size 1000000000 and --batch-size 32"],
                          [["--data", str(corpora / "short.txt"), "--block-size", "16"],
                           "too long for the corpus"]):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pyflow.models.train", *argv,
                               "--out", str(tmp_path / "out")], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(PREFIX) and proc.stderr.count("\n") == 1, proc.stderr
        assert message in proc.stderr and "Traceback" not in proc.stderr
        assert time.perf_counter() - t0 < 60
        assert not (tmp_path / "out").exists()


def test_memory_bound_is_a_lower_bound_that_passes_real_runs():
    """The refusal only fires far above what the presets take: the default
    tiny run needs a few MiB; gpt2 at its own context a few GiB."""
    args = train.parse_args(["--data", "synthetic"])
    args.block_size = 64
    assert train.memory_needed(args, 96, 1) < 64 << 20
    args = train.parse_args(["--preset", "gpt2", "--batch-size", "8", "--data", "synthetic"])
    args.block_size = 1024
    assert 2 << 30 < train.memory_needed(args, 50257, 1) < 16 << 30


def test_trainer_start_removes_stale_checkpoint_temporaries(corpora, tmp_path, capsys,
                                                            monkeypatch):
    """The temporary files of saves killed in an earlier run are gone once the
    trainer starts (before its first checkpoint), the run's own file kept."""
    ckpt_dir = tmp_path / "ck"
    ckpt_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = [ckpt_dir / f"{train.CKPT_NAME}.pyflow-tmp-{dead.pid}-0123abcd",
             ckpt_dir / f".{train.CKPT_NAME}.{'b' * 32}.tmp"]
    for path in stale:
        path.write_bytes(b"\0" * 1000)
    keep = ckpt_dir / "notes.txt"
    keep.write_text("mine")
    seen = []
    real_save = pf.save

    def spy(obj, f, *a, **k):          # what the folder holds at the first checkpoint
        seen.append(sorted(os.listdir(ckpt_dir)))
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(pf, "save", spy)
    assert train.main(["--data", str(corpora / "text.txt"), "--block-size", "8",
                       "--batch-size", "2", "--steps", "1", "--eval-iters", "1",
                       "--ckpt-dir", str(ckpt_dir), "--no-progress"]) == 0
    assert seen == [["notes.txt"]]
    assert sorted(os.listdir(ckpt_dir)) == [train.CKPT_NAME, "notes.txt"]
    assert "removed 2 temporary file(s) of killed checkpoint saves" in capsys.readouterr().out
    assert serialization.temporary_files(ckpt_dir / train.CKPT_NAME) == []
