"""Run under ``mpirun -n N python sbp_ops_worker.py``: ops on global tensors
(SBP deduction, boxing, backward) against the same ops on one rank.

For each op and every combination of input SBPs (S(0), S(1), B, P where the
input has those dims), every rank builds its piece of each input, runs the op
on global tensors, and the result gathered to broadcast must equal the
single-rank result; then ``(out * R).sum().backward()`` (R a replicated
reference) must give each rank's local piece the gradient the single-rank
run gives, in that piece's layout.  float64 inputs, so the sums of pieces are
exact up to rounding.  Also: the signature deduction picks the cheap one (a
matmul of a row-split input and a replicated weight moves nothing), and a
tensor-parallel MLP and attention block (column- then row-parallel weights)
equal the single-rank block.  Ends with ``rank r: N checks, F failures``.
"""
import itertools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.rank_checks import RankChecks  # noqa: E402

import numpy as np  # noqa: E402

import pyflow  # noqa: E402
import pyflow.nn.functional as F  # noqa: E402
from pyflow.distributed import env, placement  # noqa: E402
from pyflow.distributed import sbp as S  # noqa: E402

RANK, SIZE = env.get_rank(), env.get_world_size()
PLC = placement("cpu", list(range(SIZE)))
check = RankChecks(RANK)


def reference(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape)


def piece(X, sbp):
    if sbp == S.broadcast:
        return X
    if sbp == S.partial_sum:    # rank-dependent parts that add up to X
        parts = [reference(X.shape, 100 + k) for k in range(SIZE - 1)]
        return parts[RANK] if RANK < SIZE - 1 else X - sum(parts, np.zeros_like(X))
    size = X.shape[sbp.dim] // SIZE
    return np.take(X, range(RANK * size, (RANK + 1) * size), axis=sbp.dim)


def grad_piece(G, sbp):
    """The gradient of a rank's piece: its slice for S, the whole for B and P."""
    return piece(G, sbp) if sbp.is_split else G


def layouts(shape):
    return [S.broadcast, S.partial_sum] + [S.split(d) for d in range(len(shape))
                                           if shape[d] % SIZE == 0]


def run_case(name, fn, shapes, int_inputs=(), grads=True, combos=None, rtol=1e-9):
    arrays = [np.random.default_rng(i).integers(0, 5, s) if i in int_inputs
              else reference(s, i) for i, s in enumerate(shapes)]
    ref_in = [pyflow.tensor(a, requires_grad=grads and i not in int_inputs)
              for i, a in enumerate(arrays)]
    ref_out = fn(*ref_in)
    R = reference(tuple(ref_out.shape), 99)
    if grads:
        (ref_out * pyflow.tensor(R)).sum().backward()
    options = [[S.broadcast] + [s for s in layouts(a.shape) if s.is_split] if i in int_inputs
               else layouts(a.shape) for i, a in enumerate(arrays)]
    for sbps in combos or itertools.product(*options):
        tag = f"{name} {'/'.join(repr(s).replace('pyflow.sbp.', '') for s in sbps)}"

        def run(sbps=sbps):
            local = [pyflow.tensor(piece(a, s), requires_grad=grads and i not in int_inputs)
                     for i, (a, s) in enumerate(zip(arrays, sbps))]
            glob = [t.to_global(PLC, s) for t, s in zip(local, sbps)]
            out = fn(*glob)
            assert out.is_global and tuple(out.shape) == tuple(ref_out.shape), \
                (out.is_global, out.shape, ref_out.shape)
            whole = out.to_global(sbp=S.broadcast).to_local().detach().numpy()
            loss = None
            if grads:
                loss = (out * pyflow.tensor(R).to_global(PLC, S.broadcast)).sum()
                loss.backward()
            np.testing.assert_allclose(whole, ref_out.detach().numpy(), rtol=rtol, atol=1e-9)
            for i, (t, s) in enumerate(zip(local, sbps)):
                if grads and i not in int_inputs:
                    np.testing.assert_allclose(t.grad.numpy(), grad_piece(ref_in[i].grad.numpy(),
                                                                          s),
                                               rtol=rtol, atol=1e-9, err_msg=f"input {i}")
        check(tag, run)


def ops():
    n = SIZE
    run_case("add broadcast", lambda a, b: a + b, [(2 * n, 2 * n), (2 * n,)])
    run_case("mul", lambda a, b: a * b, [(n, 2 * n), (n, 2 * n)])
    run_case("div", lambda a, b: a / (b * b + 1.0), [(n, n), (n, n)])
    run_case("sub scalar", lambda a: (a - 2.0) * 3.0, [(n, 2 * n)])
    run_case("number first", lambda a, b: (2.0 - a) * b + pyflow.pow(2.0, b),
             [(n, 2 * n), (n, 2 * n)])
    run_case("unary chain", lambda a: F.gelu(pyflow.tanh(a) * a.exp()).relu(), [(n, 2 * n)])
    run_case("matmul", lambda a, b: a @ b, [(2 * n, n), (n, 2 * n)])
    run_case("batched matmul", lambda a, b: a @ b, [(n, 2, n), (n, n, 2)])
    run_case("linear", lambda x, w, b: F.linear(x, w, b), [(n, 2 * n), (n, 2 * n), (n,)])
    run_case("sum dims", lambda a: a.sum(1) + a.sum(0, keepdim=True).sum(), [(n, 2 * n)])
    run_case("mean", lambda a: a.mean(0) * a.mean(), [(2 * n, n)])
    run_case("softmax", lambda a: F.softmax(a, -1) + F.log_softmax(a, 0), [(n, 2 * n)])
    run_case("layer_norm", lambda x, w, b: F.layer_norm(x, (2 * n,), w, b),
             [(n, 2 * n), (2 * n,), (2 * n,)])
    run_case("cross_entropy", lambda x, t: F.cross_entropy(x, t).reshape(1),
             [(2 * n, 5), (2 * n,)], int_inputs=(1,))
    run_case("embedding", lambda i, w: F.embedding(i, w), [(n, 2), (5, n)], int_inputs=(0,))
    run_case("views", lambda a: a.view(n, 2, n).transpose(0, 2).reshape(n, 2 * n).t(),
             [(n, 2 * n)])
    run_case("permute slice", lambda a: a.permute(2, 0, 1)[:, 1:, :].contiguous(),
             [(n, 2, n)])
    run_case("cat split", lambda a, b: pyflow.cat(pyflow.cat([a, b], 1).split(1, 1)[::-1], 1),
             [(n, 2), (n, 2)])
    run_case("attention", lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                          is_causal=True),
             [(n, n, 4, 2)] * 3, combos=[(s, s, s) for s in
                                         (S.split(0), S.split(1), S.broadcast)])


def deduction():
    x = pyflow.randn(2 * SIZE, 4).to_global(PLC, S.split(0))
    w = pyflow.randn(4, 3).to_global(PLC, S.broadcast)
    y = x @ w
    assert y.sbp == (S.split(0),), y.sbp           # rows stay split, nothing moved
    w2 = pyflow.randn(4, 3 * SIZE).to_global(PLC, S.split(1))
    y2 = pyflow.randn(2, 4).to_global(PLC, S.broadcast) @ w2
    assert y2.sbp == (S.split(1),), y2.sbp
    a = pyflow.randn(2, 4 * SIZE).to_global(PLC, S.split(1))
    b = pyflow.randn(4 * SIZE, 3).to_global(PLC, S.split(0))
    assert (a @ b).sbp == (S.partial_sum,), (a @ b).sbp     # reduced dim split: a partial sum


def tensor_parallel_block():
    """Megatron's MLP: column-parallel fc (weight S(0) = split output features),
    row-parallel proj (weight S(1)); then a data-parallel x tensor-parallel mix."""
    d, h = 4, 4 * SIZE
    X, W1, B1, W2, B2 = (reference(s, i) for i, s in
                         enumerate([(2 * SIZE, d), (h, d), (h,), (d, h), (d,)]))

    def block(x, w1, b1, w2, b2):
        return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)
    ref = [pyflow.tensor(a, requires_grad=True) for a in (X, W1, B1, W2, B2)]
    want = block(*ref)
    want.sum().backward()
    for x_sbp in (S.broadcast, S.split(0)):
        sbps = (x_sbp, S.split(0), S.split(0), S.split(1), S.broadcast)
        local = [pyflow.tensor(piece(a, s), requires_grad=True)
                 for a, s in zip((X, W1, B1, W2, B2), sbps)]
        out = block(*[t.to_global(PLC, s) for t, s in zip(local, sbps)])
        hidden_sbp = F.linear(local[0].to_global(PLC, x_sbp), local[1].to_global(PLC, S.split(0)),
                              local[2].to_global(PLC, S.split(0))).sbp
        if x_sbp == S.broadcast:     # Megatron's layout: no communication in between
            assert hidden_sbp == (S.split(1),), hidden_sbp
        out.sum().backward()
        np.testing.assert_allclose(out.to_global(sbp=S.broadcast).to_local().detach().numpy(),
                                   want.detach().numpy(), rtol=1e-10)
        for t, r, s in zip(local, ref, sbps):
            np.testing.assert_allclose(t.grad.numpy(), grad_piece(r.grad.numpy(), s),
                                       rtol=1e-9, atol=1e-12)


def global_parameters_train():
    """Data parallel through SBP: parameters replicated (global leaves), the batch
    split; SGD steps equal single-rank training on the whole batch."""
    X, Y = reference((4 * SIZE, 3), 1), reference((4 * SIZE, 2), 2)
    pyflow.manual_seed(0)
    ref_model = pyflow.nn.Linear(3, 2).double()
    model = pyflow.nn.Linear(3, 2).double()
    model.load_state_dict(ref_model.state_dict())
    for name, p in list(model.named_parameters()):
        g = pyflow.nn.Parameter(p.detach().to_global(PLC, S.broadcast))
        setattr(model, name, g)
    opts = [pyflow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ref_model, model)]
    x = pyflow.tensor(piece(X, S.split(0))).to_global(PLC, S.split(0))
    y = pyflow.tensor(piece(Y, S.split(0))).to_global(PLC, S.split(0))
    for _ in range(3):
        for m, opt, (xi, yi) in zip((ref_model, model), opts,
                                    ((pyflow.tensor(X), pyflow.tensor(Y)), (x, y))):
            opt.zero_grad()
            F.mse_loss(m(xi), yi).backward()
            opt.step()
    assert model.weight.sbp == (S.broadcast,) and model.weight.grad.sbp == (S.broadcast,)
    np.testing.assert_allclose(model.weight.to_local().detach().numpy(), ref_model.weight.detach().numpy(),
                               rtol=1e-10)
    np.testing.assert_allclose(model.bias.to_local().detach().numpy(), ref_model.bias.detach().numpy(),
                               rtol=1e-10)


def twin_mlps(hidden, activation):
    """Two equal float64 MLPs 3 -> hidden -> 2: the one-rank reference and the one
    to make global."""
    ref = pyflow.nn.Sequential(pyflow.nn.Linear(3, hidden), activation(),
                               pyflow.nn.Linear(hidden, 2)).double()
    model = pyflow.nn.Sequential(pyflow.nn.Linear(3, hidden), activation(),
                                 pyflow.nn.Linear(hidden, 2)).double()
    model.load_state_dict(ref.state_dict())
    return ref, model


def graph_training(executor):
    """The same data-parallel step as a static graph (nn.Graph), and a
    tensor-parallel MLP in it: equal to single-rank eager training."""
    X, Y = reference((4 * SIZE, 3), 1), reference((4 * SIZE, 2), 2)
    pyflow.manual_seed(0)
    ref_model, model = twin_mlps(4 * SIZE, pyflow.nn.GELU)
    layout = {"0.weight": S.split(0), "0.bias": S.split(0), "2.weight": S.split(1),
              "2.bias": S.broadcast}          # Megatron's MLP
    for name, p in list(model.named_parameters()):
        mod, attr = name.split(".")
        g = pyflow.tensor(piece(p.detach().numpy(), layout[name])).to_global(PLC, layout[name])
        setattr(model[int(mod)], attr, pyflow.nn.Parameter(g))
    opts = [pyflow.optim.AdamW(m.parameters(), lr=0.01) for m in (ref_model, model)]

    class Train(pyflow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opts[1])
            self.config.set_executor(executor)

        def build(self, x, y):
            loss = F.mse_loss(self.model(x), y)
            loss.backward()
            return loss
    graph = Train()
    x = pyflow.tensor(piece(X, S.split(0))).to_global(PLC, S.split(0))
    y = pyflow.tensor(piece(Y, S.split(0))).to_global(PLC, S.split(0))
    for _ in range(3):
        opts[0].zero_grad()
        want = F.mse_loss(ref_model(pyflow.tensor(X)), pyflow.tensor(Y))
        want.backward()
        opts[0].step()
        got = graph(x, y)
        np.testing.assert_allclose(got.to_global(sbp=S.broadcast).to_local().numpy(),
                                   want.detach().numpy(), rtol=1e-10)
    text = pyflow.explain(graph)
    assert "SBP (forward signatures" in text and "-> (S(1))" in text, text
    assert "gradient all_reduce (data parallel): 1 parameters in 1 bucket(s)" in text, text
    for name, p in model.named_parameters():
        assert p.sbp == (layout[name],), (name, p.sbp)
        ref = dict(ref_model.named_parameters())[name].detach().numpy()
        np.testing.assert_allclose(p.to_local().detach().numpy(), piece(ref, layout[name]),
                                   rtol=1e-9, err_msg=name)


def hybrid_2d(executor):
    """Data x tensor parallel on a 2x2 placement: axis 0 splits the batch, axis 1
    the MLP's hidden features (Megatron); eager and graph training equal one rank."""
    plc = placement("cpu", [[0, 1], [2, 3]])
    B2 = (S.broadcast, S.broadcast)
    X, Y = reference((8, 3), 1), reference((8, 2), 2)
    pyflow.manual_seed(0)
    ref_model, model = twin_mlps(8, pyflow.nn.GELU)
    layout = {"0.weight": S.split(0), "0.bias": S.split(0), "2.weight": S.split(1),
              "2.bias": S.broadcast}
    for name, p in list(model.named_parameters()):
        mod, attr = name.split(".")
        g = p.detach().to_global(plc, B2).to_global(sbp=(S.broadcast, layout[name]))
        setattr(model[int(mod)], attr, pyflow.nn.Parameter(g))
    opts = [pyflow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ref_model, model)]
    step = lambda m, x, y: F.mse_loss(m(x), y)          # noqa: E731

    class Train(pyflow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opts[1])
            self.config.set_executor(executor or "sequential")

        def build(self, x, y):
            loss = step(self.model, x, y)
            loss.backward()
            return loss
    graph = Train() if executor else None
    x, y = (pyflow.tensor(a).to_global(plc, B2).to_global(sbp=(S.split(0), S.broadcast))
            for a in (X, Y))
    for _ in range(3):
        opts[0].zero_grad()
        want = step(ref_model, pyflow.tensor(X), pyflow.tensor(Y))
        want.backward()
        opts[0].step()
        if graph is None:
            opts[1].zero_grad()
            got = step(model, x, y)
            got.backward()
            opts[1].step()
        else:
            got = graph(x, y)
        np.testing.assert_allclose(got.to_global(sbp=B2).to_local().detach().numpy(),
                                   want.detach().numpy(), rtol=1e-10)
    for name, p in model.named_parameters():
        assert p.sbp == (S.broadcast, layout[name]), (name, p.sbp)
        ref = dict(ref_model.named_parameters())[name].detach().numpy()
        np.testing.assert_allclose(p.to_global(sbp=B2).to_local().detach().numpy(), ref,
                                   rtol=1e-9, err_msg=name)


def graph_buckets_and_accumulation():
    """Data parallel in a graph with gradient buckets of 64 bytes (several buckets,
    posted as backward reaches them) and 2 accumulation steps: equal to one rank."""
    from pyflow.graph.executor import GradSync
    X, Y = reference((4 * SIZE, 3), 1), reference((4 * SIZE, 2), 2)
    pyflow.manual_seed(0)
    ref_model, model = twin_mlps(8, pyflow.nn.Tanh)
    model.to_global(PLC, S.broadcast)
    opts = [pyflow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ref_model, model)]

    class Train(pyflow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opts[1])
            self.config.set_gradient_accumulation_steps(2)

        def build(self, x, y):
            loss = F.mse_loss(self.model(x), y)
            loss.backward()
            return loss
    saved, GradSync.bucket_bytes = GradSync.bucket_bytes, 64
    try:
        graph = Train()
        x = pyflow.tensor(piece(X, S.split(0))).to_global(PLC, S.split(0))
        y = pyflow.tensor(piece(Y, S.split(0))).to_global(PLC, S.split(0))
        for _ in range(3):
            opts[0].zero_grad()
            F.mse_loss(ref_model(pyflow.tensor(X)), pyflow.tensor(Y)).backward()
            opts[0].step()
            graph(x, y)
        sync = graph.plans[0].grad_sync
        assert len(sync.bucketers[0].buckets) > 1, sync.bucketers[0]
    finally:
        GradSync.bucket_bytes = saved
    for (name, p), q in zip(model.named_parameters(), ref_model.parameters()):
        np.testing.assert_allclose(p.to_local().detach().numpy(), q.detach().numpy(),
                                   rtol=1e-10, err_msg=name)


if __name__ == "__main__":
    ops()
    check("graph data parallel: several buckets, accumulation", graph_buckets_and_accumulation)
    if SIZE == 4:
        check("2-D data x tensor parallel (eager)", hybrid_2d, None)
        check("2-D data x tensor parallel (graph)", hybrid_2d, "sequential")
    check("graph training (sequential)", graph_training, "sequential")
    check("graph training (actors)", graph_training, "actors")
    check("deduction picks the cheap signature", deduction)
    check("tensor-parallel MLP", tensor_parallel_block)
    check("data-parallel training with global parameters", global_parameters_train)
    check.report_and_exit()
