"""Run under ``mpirun -n N python ddp_worker.py``: DDP training checked against
single-process training on the same global batch, on every rank.

Each rank builds the model from a rank-dependent seed (so only DDP's broadcast
from rank 0 makes the replicas equal), trains it wrapped in
DistributedDataParallel on its contiguous slice of each global batch with a
mean loss, and trains a plain copy of rank 0's initial model on the whole
global batch in the same process.  After each step the global loss (mean of
the ranks' losses) and every weight must agree within 1e-5.  Variants: one
bucket (default cap), one bucket per parameter (tiny cap, several collectives
overlapping backward), SGD with momentum, gradient accumulation under
``no_sync``.  Ends with ``rank r: N checks, F failures``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.rank_checks import RankChecks  # noqa: E402

import numpy as np  # noqa: E402

import pyflow  # noqa: E402
import pyflow.comm as comm  # noqa: E402
from pyflow import nn  # noqa: E402
from pyflow.distributed import env  # noqa: E402
from pyflow.nn.parallel import DistributedDataParallel  # noqa: E402

RANK, SIZE = env.get_rank(), env.get_world_size()
GLOBAL_BATCH, STEPS, TOL = 8, 3, 1e-5

check = RankChecks(RANK)


def mlp(seed):
    pyflow.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(),
                         nn.Linear(16, 3)).double()


def batches(step):
    rng = np.random.default_rng(100 + step)
    return (pyflow.tensor(rng.standard_normal((GLOBAL_BATCH, 5))),
            pyflow.tensor(rng.standard_normal((GLOBAL_BATCH, 3))))


def close(name, got, want):
    err = float(np.max(np.abs(np.asarray(got) - np.asarray(want)))) if np.size(want) else 0.0
    assert err <= TOL, f"{name}: max error {err:.3g} > {TOL}"


def run(variant, bucket_cap_mb, momentum=0.0, micro=1):
    local = GLOBAL_BATCH // SIZE
    model = mlp(seed=1 + RANK)                                 # ranks differ before DDP
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    reference = mlp(seed=1)                                    # rank 0's initial model
    check(f"{variant}: broadcast made replicas equal", lambda: [
        close(f"init {n}", p.detach().numpy(), q.detach().numpy())
        for (n, p), q in zip(model.named_parameters(), reference.parameters())])
    opt = pyflow.optim.SGD(ddp.parameters(), lr=0.1, momentum=momentum)
    ref_opt = pyflow.optim.SGD(reference.parameters(), lr=0.1, momentum=momentum)
    loss_fn = nn.MSELoss()
    for step in range(STEPS):
        x, y = batches(step)
        # DDP: this rank's slice, split again into `micro` accumulated micro-batches.
        opt.zero_grad()
        xs, ys = x[RANK * local:(RANK + 1) * local], y[RANK * local:(RANK + 1) * local]
        m = local // micro
        total = 0.0
        for k in range(micro):
            xb, yb = xs[k * m:(k + 1) * m], ys[k * m:(k + 1) * m]
            loss = loss_fn(ddp(xb), yb) / micro
            if k < micro - 1:
                with ddp.no_sync():
                    loss.backward()
            else:
                loss.backward()
            total += loss.item()
        opt.step()
        global_loss = comm.all_reduce(pyflow.tensor([total], dtype=pyflow.float64), "avg").item()
        # Single process: the whole global batch.
        ref_opt.zero_grad()
        ref_loss = loss_fn(reference(x), y)
        ref_loss.backward()
        ref_opt.step()
        check(f"{variant}: step {step} loss", close, "loss", global_loss, ref_loss.item())
        for (n, p), q in zip(model.named_parameters(), reference.parameters()):
            check(f"{variant}: step {step} {n}", close, n, p.detach().numpy(), q.detach().numpy())
    want = STEPS * len(ddp.bucketer.buckets)
    check(f"{variant}: one collective per bucket per step",
          lambda: (_ for _ in ()).throw(AssertionError(ddp.bucketer.collectives))
          if ddp.bucketer.collectives != want else None)
    return ddp


run("one bucket", 25)
ddp = run("bucket per parameter", 1e-6)
check("tiny cap gives a bucket per parameter",
      lambda: (_ for _ in ()).throw(AssertionError(len(ddp.bucketer.buckets)))
      if len(ddp.bucketer.buckets) != 6 else None)
run("momentum, 2 buckets", 600 * 8 / 2 ** 20, momentum=0.9)
if (GLOBAL_BATCH // SIZE) % 2 == 0:
    run("no_sync accumulation", 25, micro=2)

check.report_and_exit()
