"""bench/dlperf.py's machinery on toy sizes: the PyTorch side runs the very same
model files (same parameter names and shapes), every mode trains, failures
reach the table instead of hiding, the end-to-end run writes its Markdown
report with the scaling table, and bad flags or a missing GPU fail clearly.
The real measurements are the benchmark's job, never a test's."""
import os
import subprocess
import sys

import numpy as np
import pytest

import pyflow as pf
from bench import dlperf
from bench.common import write_section
from tests.helpers import needs_torch, torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "dlperf.py")
TINY = dlperf.PRESETS["tiny"]


def _env():
    """The test's environment without the CUDA simulator switch (the bench refuses it)."""
    return {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}


# ------------------------------------------------------------------ presets
def test_presets_cover_every_model_and_state_dlperfs_gpu_configurations():
    for device in ("cpu", "cuda", "tiny"):
        assert set(dlperf.PRESETS[device]) == set(dlperf.MODELS)
    cuda = dlperf.PRESETS["cuda"]
    assert (cuda["resnet"].config["image"], cuda["resnet"].batch) == (224, 128)
    assert (cuda["bert"].config["seq"], cuda["bert"].batch) == (128, 32)
    assert cuda["bert"].config["num_hidden_layers"] == 12
    assert cuda["gpt"].config["n_layer"] == 12 and cuda["gpt"].config["n_embd"] == 768
    cpu = dlperf.PRESETS["cpu"]
    assert [cpu[m].target for m in ("resnet", "bert", "gpt")] == [0.5, 1.0, 1.0]
    # the CPU presets keep the real widths; what they shrink is written in the table
    assert cpu["bert"].config["hidden_size"] == 768 and cpu["gpt"].config["n_embd"] == 768
    assert "layers" in cpu["gpt"].shape and "64x64" in cpu["resnet"].shape


# ------------------------------------------------------------------ the same model on both sides
@needs_torch
@pytest.mark.parametrize("model", dlperf.MODELS)
def test_torch_side_is_the_same_model_file(model):
    rng = np.random.default_rng(0)
    ours, inputs, _, _ = dlperf.build(pf, TINY[model], 2, "cpu", rng)
    twin, twin_inputs, _, _ = dlperf.build(torch, TINY[model], 2, "cpu",
                                           np.random.default_rng(0))
    assert isinstance(twin, torch.nn.Module)
    assert [(n, tuple(p.shape)) for n, p in ours.named_parameters()] == \
        [(n, tuple(p.shape)) for n, p in twin.named_parameters()]
    for a, b in zip(inputs, twin_inputs):           # the same synthetic batch
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@needs_torch
def test_twin_loader_binds_torch_only_inside_the_loaded_module():
    before = {k: sys.modules.get(k) for k in ("pyflow", "pyflow.nn", "pyflow.nn.functional")}
    twin = dlperf.load_model_module("gpt", torch)
    assert twin.pyflow is torch and twin.nn is torch.nn and twin.F is torch.nn.functional
    assert {k: sys.modules.get(k) for k in before} == before
    assert dlperf.load_model_module("gpt", pf).nn is pf.nn


@pytest.mark.parametrize("mode", ["eager", "graph"])
@pytest.mark.parametrize("model", ["resnet", "bert"])
def test_timed_worker_trains_every_model_in_both_modes(model, mode):
    out = dlperf.timed_worker(mode, TINY[model], 2, "cpu", steps=2, warmup=1)
    assert np.isfinite(out["loss"]) and len(out["step_s"]) == 2
    # on the CPU: batch / the median step time (the median of two is their mean)
    assert out["samples_per_s"] == pytest.approx(2 / np.mean(out["step_s"]))
    assert out["seconds"] >= sum(out["step_s"])


# ------------------------------------------------------------------ failures are reported
def test_a_failing_worker_reports_its_error_as_one_result_line(capsys):
    def broken():
        raise RuntimeError("graph mode cannot trace this op\nsecond line")
    dlperf._emit(broken)
    line = capsys.readouterr().out.strip()
    assert line == dlperf.RESULT + '{"error": "RuntimeError: graph mode cannot trace this op"}'


def test_failed_runs_show_in_the_table_and_the_target_uses_what_was_measured():
    ok = lambda *rates: dlperf._summary([{"samples_per_s": r} for r in rates])   # noqa: E731
    failed = dlperf._summary([{"error": "RuntimeError: boom"}])
    results = {"gpt": {"torch": ok(10.0, 12.0, 11.0), "eager": ok(12.0), "graph": failed},
               "resnet": {"torch": ok(10.0), "eager": ok(4.0), "graph": ok(4.5)}}
    rows = dlperf.throughput_rows("cpu", results)
    gpt, resnet = rows
    assert gpt[3] == "11.0 (10.0-12.0)" and gpt[5] == "failed: RuntimeError: boom"
    # ratios of the medians, and of the best runs when there were several
    assert gpt[6:] == ["1.09x (best 1.00x)", "-", ">= 1.0x", "met"]
    assert resnet[6:] == ["0.40x", "0.45x", ">= 0.5x", "not met"]
    # a run slowed by foreign load: medians and best runs disagree, and the table says so
    loaded = {"bert": {"torch": ok(2.0, 10.0, 10.0), "eager": ok(9.0, 9.0, 9.0),
                       "graph": ok(8.0, 8.0, 8.0)}}
    [bert] = dlperf.throughput_rows("cpu", loaded)
    assert bert[6:] == ["0.90x (best 0.90x)", "0.80x (best 0.80x)", ">= 1.0x", "not met"]
    loaded["bert"]["torch"] = ok(2.0, 2.0, 10.0)
    [bert] = dlperf.throughput_rows("cpu", loaded)
    assert bert[6] == "4.50x (best 0.90x)" and bert[9] == "met by medians only"
    half = dlperf._summary([{"samples_per_s": 3.0}, {"error": "timed out after 9 s"}])
    assert dlperf._cell(half) == "3.0 [1 run(s) failed: timed out after 9 s]"
    table = dlperf.markdown_table(rows, dlperf.THROUGHPUT_HEADERS)
    assert table.count("\n") == 3 and "failed: RuntimeError: boom" in table


def test_scaling_rows_give_speedup_and_efficiency():
    ok = lambda r: dlperf._summary([{"samples_per_s": r}])    # noqa: E731
    [row] = dlperf.scaling_rows("cpu", {"gpt": {1: ok(10.0), 2: ok(18.0)}})
    assert row[2:] == ["8", "10.0", "18.0", "1.80x", "90%"]
    [row] = dlperf.scaling_rows("cpu", {"gpt": {1: dlperf._summary([{"samples_per_s": 10.0},
                                                                   {"samples_per_s": 8.0}]),
                                                2: ok(17.0)}})
    assert row[5:] == ["1.89x (best 1.70x)", "94% (best 85%)"]


# ------------------------------------------------------------------ end to end, and bad input
def test_end_to_end_writes_the_report_with_both_tables(tmp_path):
    out = tmp_path / "RESULTS.md"
    proc = subprocess.run([sys.executable, SCRIPT, "--preset", "tiny", "--models", "gpt",
                           "--scaling", "gpt", "--rounds", "1", "--steps", "1", "--warmup", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=300,
                          env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = out.read_text()
    assert text.strip() in proc.stdout                   # printed and written alike
    for needle in ("cores", "numba ", "torch ", "pyflow ", "git ", "load average",
                   "| GPT (tiny) | 2 layers d=32, T=8, vocab 64 | 2 |",
                   "2 ranks samples/s (global)", "Generated by `python bench/dlperf.py"):
        assert needle in text, needle
    rows = [ln for ln in text.splitlines() if ln.startswith("| GPT (tiny)")]
    assert len(rows) == 2 and "failed" not in text
    assert rows[0].rstrip(" |").split(" | ")[-1] in ("met", "not met")
    assert rows[1].split(" | ")[-2].endswith("x")        # the speedup


def test_bad_flags_fail_with_a_clear_message(capsys):
    with pytest.raises(SystemExit):
        dlperf.parse_args(["--rounds", "0"])
    assert "--rounds: must be a positive integer, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        dlperf.parse_args(["--models", "vgg"])
    assert "invalid choice: 'vgg'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        dlperf.parse_args(["--device", "cuda", "--scaling", "gpt"])
    assert "--scaling runs on CPU ranks only" in capsys.readouterr().err
    args = dlperf.parse_args(["--device", "cuda"])
    assert (args.preset, args.warmup, args.steps, args.scaling) == ("cuda", 20, 100, [])


def test_cuda_without_a_gpu_fails_clearly(tmp_path):
    if pf.cuda.is_available() and not pf.cuda.simulated():
        pytest.skip("a GPU is present: the cuda run would really run")
    out = tmp_path / "RESULTS.md"
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cuda", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=_env())
    assert proc.returncode != 0 and not out.exists()
    assert "dlperf: --device cuda needs a real GPU that pyflow can use:" in proc.stderr
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cuda", "--out", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**_env(), "NUMBA_ENABLE_CUDASIM": "1"})
    assert proc.returncode != 0 and "simulator" in proc.stderr and not out.exists()


def test_report_warns_when_the_machine_was_busy():
    args = dlperf.parse_args(["--models", "gpt"])
    ok = dlperf._summary([{"samples_per_s": 5.0}])
    results = {"gpt": {"torch": ok, "eager": ok, "graph": ok}}
    facts = {"cpu": "Some CPU", "cores": 2, "load": "load average: 3.10", "load1": 3.1,
             "versions": "Python 3"}
    busy = dlperf.report(args, facts, results, {}, "later", "python bench/dlperf.py", "now", 60)
    assert "shared with other work** (load average 3.1 on 2 cores" in busy
    assert "Data-parallel scaling" not in busy and "| GPT-2 small |" in busy
    quiet = dlperf.report(args, {**facts, "load1": 0.1}, results, {}, "later", "cmd", "now", 60)
    assert "shared with other work" not in quiet and "load average: 3.10" in quiet


def test_roofline_table_and_results_section(tmp_path):
    """bench/roofline.py's table from measured numbers (its children are the
    dlperf workers and one GEMM, copy and count worker each; run by hand, as
    the whole script takes minutes): achieved GFLOP/s against the peak and the
    roofline bound, a failed mode said so; the section replaces an older one
    in a results file and keeps the rest."""
    import argparse
    from bench import roofline
    from bench.dlperf import PRESETS
    p = PRESETS["cpu"]["resnet"]
    counts = {"flops": 40e9, "bytes": 4e9}              # 10 FLOP per byte
    rows = [(p, counts, {"torch": 0.5, "eager": 1.0, "graph": None})]
    text = roofline.markdown(argparse.Namespace(gemm_size=2048), "a machine", 100.0,
                             {"numpy": {"gflops": 100.0}, "mkl": {"error": "no MKL"}}, 5.0, rows)
    row = next(line for line in text.splitlines() if line.startswith("| ResNet-50"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1:5] == ["40.00", "4.00", "10.0", "50.0"]      # bound: 10 FLOP/B x 5 GB/s
    assert cells[5] == "80.0 (80% of peak, 160% of bound)"
    assert cells[6] == "40.0 (40% of peak, 80% of bound)"
    assert cells[7] == "failed"
    assert "best of numpy 100.0, 2048^3" in text
    results = tmp_path / "RESULTS.md"
    results.write_text("# DLPerf\n\n## Throughput\n\nold table\n\n## Roofline\n\nold roofline\n")
    write_section(str(results), roofline.SECTION, text)
    write_section(str(results), roofline.SECTION, text)
    out = results.read_text()
    assert "old table" in out and "old roofline" not in out and out.count("## Roofline") == 1


# ------------------------------------------------------------------ mixed precision (--amp)
def test_amp_table_ratios_and_targets_from_made_up_numbers():
    ok = lambda *rates: dlperf._summary([{"samples_per_s": r} for r in rates])   # noqa: E731
    results = {"gpt": {"torch": ok(10.0), "eager": ok(8.0), "graph": ok(10.0),
                       "torch bf16": ok(20.0), "eager bf16": ok(18.0), "graph bf16": ok(24.0)},
               "bert": {"torch": ok(10.0), "eager": ok(10.0), "graph": ok(10.0),
                        "torch bf16": ok(20.0, 30.0), "eager bf16": ok(15.0, 25.0),
                        "graph bf16": dlperf._summary([{"error": "RuntimeError: boom"}])},
               "resnet": {"torch bf16": ok(10.0), "eager bf16": ok(5.0), "graph bf16": ok(12.0)}}
    gpt, bert, resnet = dlperf.amp_rows("cpu", results)
    assert len(gpt) == len(dlperf.AMP_HEADERS)
    assert gpt[3:6] == ["20.0", "18.0", "24.0"]
    # pyflow / torch AMP per mode, AMP / FP32 per mode (eager 18/8, graph 24/10)
    assert gpt[6:10] == ["0.90x", "1.20x", "2.25x", "2.40x"]
    # the AMP/FP32 target: the better AMP mode (24) over the better FP32 mode (10)
    assert gpt[10:] == ["pyflow/torch AMP >= 1.0x", "met", "pyflow AMP/FP32 >= 2.0x", "met"]
    assert bert[5] == "failed: RuntimeError: boom" and bert[7] == bert[9] == "-"
    assert bert[6] == "0.80x (best 0.83x)" and bert[8] == "2.00x (best 2.50x)"
    assert bert[11] == "not met" and bert[13] == "met"
    # FP32 not measured in this run (--amp bf16): no AMP/FP32 ratio, the target says so;
    # ResNet has no AMP/FP32 target
    assert resnet[6:] == ["0.50x", "1.20x", "-", "-", "pyflow/torch AMP >= 1.0x", "met", "-",
                          "no target"]
    results["gpt"] = {k: v for k, v in results["gpt"].items() if "bf16" in k}
    [gpt] = dlperf.amp_rows("cpu", {"gpt": results["gpt"]})
    assert gpt[8:10] == ["-", "-"] and gpt[13] == "not measured"
    table = dlperf.markdown_table([gpt, resnet], dlperf.AMP_HEADERS)
    assert table.count("\n") == 3 and "PyTorch AMP samples/s" in table
    assert [dlperf.PRESETS["cpu"][m].amp_gain for m in dlperf.MODELS] == [0.0, 2.0, 2.0]
    assert all(dlperf.PRESETS["cpu"][m].amp_target == 1.0 for m in dlperf.MODELS)


def test_amp_flags():
    args = dlperf.parse_args(["--amp", "bf16"])
    assert args.scaling == [] and [k for k, _, _ in dlperf.columns(args.amp)] == \
        ["torch bf16", "eager bf16", "graph bf16"]
    assert dlperf.parse_args(["--amp", "both"]).scaling == ["gpt"]
    assert len(dlperf.columns("both")) == 6 and dlperf.columns(None)[0] == ("torch", "torch", None)
    assert dlperf.parse_args([]).amp is None
    with pytest.raises(SystemExit):
        dlperf.parse_args(["--amp", "bf16", "--scaling", "gpt"])


def _amp_logits_dtype(lib, mode):
    """The dtype of the tiny GPT's logits inside ``make_amp_step``'s step (and
    the step's loss), for ``lib``."""
    lib.manual_seed(0)
    model, inputs, loss_of, opt = dlperf.build(lib, TINY["gpt"], 2, "cpu",
                                               np.random.default_rng(0))
    seen = []

    def recording(model, x, y):
        logits, loss = model(x, y)
        seen.append(logits.dtype)
        return loss
    step = dlperf.make_amp_step(lib, mode, model, inputs, recording, opt, "bf16", "cpu")
    losses = [float(step().item()) for _ in range(2)]
    assert np.all(np.isfinite(losses))
    return seen[0]


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_amp_step_runs_the_forward_in_bfloat16(mode):
    assert _amp_logits_dtype(pf, mode) == pf.bfloat16
    assert not pf.is_autocast_enabled("cpu")        # backward and step ran outside


@needs_torch
def test_amp_step_of_torch_runs_the_forward_in_bfloat16():
    assert _amp_logits_dtype(torch, "torch") == torch.bfloat16
    assert not torch.is_autocast_enabled("cpu")


@needs_torch
def test_amp_end_to_end_writes_its_own_section(tmp_path):
    out = tmp_path / "RESULTS.md"
    out.write_text("# DLPerf\n\n## Throughput\n\nold fp32 rows\n\n## Roofline\n\nroofline\n")
    proc = subprocess.run([sys.executable, SCRIPT, "--preset", "tiny", "--models", "gpt",
                           "--amp", "bf16", "--rounds", "1", "--steps", "1", "--warmup", "1",
                           "--out", str(out)], capture_output=True, text=True, timeout=300,
                          env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = out.read_text()
    assert "old fp32 rows" in text and "roofline" in text      # the other sections stay
    assert text.count(dlperf.AMP_SECTION) == 1 and "failed" not in text
    section = text.split(dlperf.AMP_SECTION, 1)[1]
    assert "| PyTorch AMP samples/s |" in section and "--amp bf16" in section
    [row] = [ln for ln in section.splitlines() if ln.startswith("| GPT (tiny)")]
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert len(cells) == len(dlperf.AMP_HEADERS)
    assert all(float(c) > 0 for c in cells[3:6])                # three AMP samples/s
    assert all(c.endswith("x") for c in cells[6:8]) and cells[8:10] == ["-", "-"]
    assert cells[10:] == ["pyflow/torch AMP >= 1.0x", cells[11], "pyflow AMP/FP32 >= 2.0x",
                          "not measured"]
    assert cells[11] in ("met", "not met", "met by medians only", "met by best runs only")
    assert row in proc.stdout
    # an FP32 run (here with no tables at all) rewrites the file and keeps the AMP section
    proc = subprocess.run([sys.executable, SCRIPT, "--models", "--scaling", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    again = out.read_text()
    assert "old fp32 rows" not in again and row in again and "roofline" in again
    assert again.index("## Roofline") < again.index(dlperf.AMP_SECTION)
