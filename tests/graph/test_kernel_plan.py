"""Kernel-level plans (pyflow/graph/kernel_plan.py): every lowered op against its
Function (values and gradients, broadcasting and non-contiguous inputs
included), no Tensor or Context per lowered op, buffers reused across steps
without clobbering what the caller holds, and the opt-out."""
import numpy as np
import pytest

import pyflow as pf
from pyflow import autograd
from pyflow.graph import kernel_ops
from tests.helpers import executors, to_numpy

# The kernel-level entries are CPU kernels: on the simulated cuda device
# (PYFLOW_TEST_DEVICE=cuda) every node runs its Tensor-level step, and the
# tests below check that the numbers are still right there; the tests about
# the lowering itself are cpu_only.
ON_CPU = pf.get_default_device().type == "cpu"
cpu_only = pytest.mark.cpu_only

EXECUTORS = executors("sequential", "actors", "actors-per-op")


def _configure(graph, executor, kernel_plan=True, fuse=False):
    graph.config.set_executor("actors" if executor == "actors-per-op" else executor)
    graph.config.allow_fuse_actor_chains(executor != "actors-per-op")
    graph.config.allow_kernel_plan(kernel_plan)
    graph.config.allow_fuse_elementwise(fuse)   # off: one node per op, so each rule is used


class Fn(pf.nn.Graph):
    """``fn(*inputs)``'s value and, when ``grads``, the gradients of its inputs
    (of ``(fn(...) * weights).sum()``, so every output element counts)."""

    def __init__(self, fn, executor, kernel_plan=True, grads=True, fuse=False):
        super().__init__()
        self.fn, self.grads = fn, grads
        _configure(self, executor, kernel_plan, fuse)

    def build(self, *xs):
        out = self.fn(*xs)
        if self.grads:
            w = pf.tensor(np.linspace(0.5, 1.5, out.numel(), dtype=np.float32)
                          .reshape(tuple(out.shape)))
            (out * w).sum().backward()
        return out


def _inputs(shapes, dtype=np.float32, seed=0, transposed=()):
    """Arrays of ``shapes``; an entry ("int", shape, n) is class indices below n."""
    rng = np.random.default_rng(seed)
    out = []
    for i, s in enumerate(shapes):
        if s[0] == "int":
            out.append(rng.integers(0, s[2], s[1]).astype(np.int64))
            continue
        a = rng.standard_normal(s).astype(dtype) + (0.5 if i else 0.0)
        if i in transposed:       # the same values, non-contiguous: a transposed view
            a = np.ascontiguousarray(a.T).T
        out.append(a)
    return out


def _leaf(a, grads):
    return pf.tensor(a, requires_grad=grads and a.dtype.kind == "f")


def _eager(fn, arrays, grads=True):
    xs = [_leaf(a.copy(), grads) for a in arrays]
    pf.manual_seed(1234)                    # dropout: the graph's run draws the same seed
    out = fn(*xs)
    if grads:
        w = pf.tensor(np.linspace(0.5, 1.5, out.numel(), dtype=np.float32)
                      .reshape(tuple(out.shape)))
        (out * w).sum().backward()
    return to_numpy(out), [to_numpy(x.grad) if x.grad is not None else None for x in xs]


def _graph(fn, arrays, executor, kernel_plan=True, grads=True, fuse=False):
    xs = [_leaf(a, grads) for a in arrays]
    if any(not a.flags.c_contiguous for a in arrays):
        xs = [pf.tensor(np.ascontiguousarray(a.T), requires_grad=grads).t()
              if not a.flags.c_contiguous else x for a, x in zip(arrays, xs)]
        xs = [x.detach().requires_grad_(grads) for x in xs]
    g = Fn(fn, executor, kernel_plan, grads, fuse)
    g(*xs)                                  # compile (and a first step)
    for x in xs:
        x.grad = None
    pf.manual_seed(1234)
    out = g(*xs)
    return to_numpy(out), [to_numpy(x.grad) if x.grad is not None else None for x in xs], g


# one case per rule: (name, fn, input shapes, non-contiguous inputs); "fused" cases
# compile with elementwise fusion on (one generated kernel for the chain)
CASES = [
    ("add", lambda a, b: a + b, [(3, 4), (3, 4)], ()),
    ("add broadcast", lambda a, b: a + b, [(2, 3, 4), (1, 4)], ()),
    ("sub scalar first", lambda a: 1.5 - a, [(3, 4)], ()),
    ("sub broadcast", lambda a, b: a - b, [(3, 1), (4,)], ()),
    ("mul", lambda a, b: a * b, [(3, 4), (3, 4)], (1,)),
    ("mul scalar", lambda a: a * 2.5, [(3, 4)], ()),
    ("div", lambda a, b: a / b, [(3, 4), (1, 4)], ()),
    ("div scalar", lambda a: a / 3.0, [(3, 4)], ()),
    ("relu", lambda a: a.relu(), [(3, 4)], (0,)),
    ("gelu", lambda a: pf.nn.functional.gelu(a), [(3, 4)], ()),
    ("gelu tanh", lambda a: pf.nn.functional.gelu(a, approximate="tanh"), [(3, 4)], ()),
    ("tanh", lambda a: a.tanh(), [(3, 4)], ()),
    ("sigmoid", lambda a: a.sigmoid(), [(3, 4)], ()),
    ("silu", lambda a: pf.nn.functional.silu(a), [(3, 4)], ()),
    ("exp", lambda a: a.exp(), [(3, 4)], ()),
    ("neg", lambda a: -a, [(3, 4)], ()),
    ("linear", lambda x, w, b: pf.nn.functional.linear(x, w, b), [(2, 3, 4), (5, 4), (5,)], ()),
    ("linear no bias", lambda x, w: pf.nn.functional.linear(x, w), [(3, 4), (5, 4)], (1,)),
    ("matmul", lambda a, b: a @ b, [(3, 4), (4, 5)], (0,)),
    ("matmul batched broadcast", lambda a, b: a @ b, [(2, 3, 4), (4, 5)], ()),
    ("sum", lambda a: a.sum(), [(3, 4)], ()),
    ("sum dim keepdim", lambda a: a.sum(1, keepdim=True), [(3, 4)], (0,)),
    ("mean dims", lambda a: a.mean((0, 2)), [(2, 3, 4)], ()),
    ("view", lambda a: a.view(4, 3) * 1.0, [(3, 4)], ()),
    ("permute", lambda a: a.permute(2, 0, 1) * 1.0, [(2, 3, 4)], ()),
    ("transpose", lambda a: a.t() @ a, [(3, 4)], ()),
    ("layer_norm", lambda x, w, b: pf.nn.functional.layer_norm(x, (4,), w, b),
     [(2, 3, 4), (4,), (4,)], ()),
    ("layer_norm no affine", lambda x: pf.nn.functional.layer_norm(x, (3, 4)), [(2, 3, 4)], ()),
    ("softmax", lambda x: pf.softmax(x, -1), [(3, 4)], ()),
    ("softmax dim 0", lambda x: pf.softmax(x, 0), [(3, 4)], (0,)),
    ("log_softmax", lambda x: pf.nn.functional.log_softmax(x, 1), [(3, 4)], ()),
    ("cross_entropy", lambda x, t: pf.nn.functional.cross_entropy(x, t),
     [(5, 4), ("int", (5,), 4)], ()),
    ("cross_entropy smoothing ignore", lambda x, t: pf.nn.functional.cross_entropy(
        x, t, ignore_index=1, label_smoothing=0.1), [(5, 4), ("int", (5,), 4)], ()),
    ("cross_entropy class weights made in the graph", lambda x, t: pf.nn.functional.cross_entropy(
        x, t, weight=t[:4].float() * 0.5 + 1.0), [(5, 4), ("int", (5,), 4)], ()),
    ("cross_entropy 3-d", lambda x, t: pf.nn.functional.cross_entropy(x, t),
     [(2, 4, 3), ("int", (2, 3), 4)], ()),
    ("nll_loss", lambda x, t: pf.nn.functional.nll_loss(x, t), [(5, 4), ("int", (5,), 4)], ()),
    ("conv2d", lambda x, w, b: pf.nn.functional.conv2d(x, w, b, stride=2, padding=1),
     [(2, 3, 7, 7), (4, 3, 3, 3), (4,)], ()),
    ("conv2d 1x1 no bias", lambda x, w: pf.nn.functional.conv2d(x, w), [(2, 3, 5, 5), (4, 3, 1, 1)],
     ()),
    ("max_pool2d", lambda x: pf.nn.functional.max_pool2d(x, 2), [(2, 3, 6, 6)], ()),
    ("max_pool2d strided padded", lambda x: pf.nn.functional.max_pool2d(x, 3, 2, 1),
     [(1, 2, 7, 7)], ()),
    ("dropout", lambda x: pf.nn.functional.dropout(x, 0.4), [(4, 8)], ()),
    ("embedding", lambda i, w: pf.nn.functional.embedding(i, w), [("int", (2, 3), 5), (5, 4)], ()),
    ("embedding padding_idx", lambda i, w: pf.nn.functional.embedding(i, w, padding_idx=1),
     [("int", (6,), 5), (5, 4)], ()),
    ("slice", lambda a: a[1:, ::2] * 1.0, [(3, 4)], ()),
    ("split", lambda a: (lambda q, k, v: q * k + v)(*a.split(2, -1)), [(3, 6)], ()),
    ("split, one piece used", lambda a: a.split(2, -1)[1] * 2.0, [(3, 6)], ()),
    ("contiguous", lambda a: a.t().contiguous() * 1.0, [(3, 4)], ()),
    ("masked_fill", lambda a: a.masked_fill(a > 0.5, -1.0), [(3, 4)], ()),
    ("where", lambda a, b: pf.where(a > b, a, b), [(3, 4), (1, 4)], ()),
    ("causal softmax", lambda a: pf.softmax(
        a.masked_fill(pf.tril(pf.ones(4, 4)) == 0, float("-inf")), -1), [(2, 4, 4)], ()),
    ("rms_norm", lambda x, w: pf.nn.functional.rms_norm(x, (4,), w, 1e-5),
     [(2, 3, 4), (4,)], ()),
    ("rms_norm no weight 2 dims", lambda x: pf.nn.functional.rms_norm(x, (3, 4)), [(2, 3, 4)],
     ()),
    ("fused_add_layer_norm", lambda a, r, w, b: (lambda y, s: y * s)(
        *pf.nn.functional.fused_add_layer_norm(a, r, (4,), w, b)),
     [(2, 3, 4), (2, 3, 4), (4,), (4,)], ()),
    ("fused_add_layer_norm, the sum unused", lambda a, r: pf.nn.functional.fused_add_layer_norm(
        a, r, (4,))[0] * 2.0, [(3, 4), (3, 4)], (1,)),
    ("fused_bias_add_gelu", lambda x, b: pf.nn.functional.fused_bias_add_gelu(x, b, "tanh"),
     [(3, 4), (4,)], (0,)),
    ("fused_bias_dropout_add", lambda x, b, r: pf.nn.functional.fused_bias_dropout_add(
        x, b, r, p=0.4), [(4, 8), (8,), (4, 8)], ()),
    ("fused_bias_dropout_add no bias", lambda x, r: pf.nn.functional.fused_bias_dropout_add(
        x, None, r, p=0.4), [(4, 8), (4, 8)], ()),
    ("fused", lambda a, b: pf.nn.functional.gelu(a * b + 0.5) * 2.0, [(2, 3, 4), (4,)], ()),
    ("fused one input used twice", lambda a: (a * a - a).tanh(), [(3, 4)], (0,)),
]


# On the simulated cuda device these cases check the Tensor-level fallback,
# which the graph tests cover at large: a few there keep its minutes short.
ON_DEVICE_TOO = {"add broadcast", "mul scalar", "linear", "sum dim keepdim", "layer_norm",
                 "causal softmax", "cross_entropy", "embedding", "split"}


@pytest.mark.parametrize("executor", EXECUTORS)
@pytest.mark.parametrize("name,fn,shapes,noncontig", [
    c if c[0] in ON_DEVICE_TOO else pytest.param(*c, marks=cpu_only) for c in CASES],
    ids=[c[0] for c in CASES])
def test_lowered_op_matches_its_function(name, fn, shapes, noncontig, executor):
    arrays = _inputs(shapes, transposed=noncontig)
    want, want_grads = _eager(fn, arrays)
    got, grads, g = _graph(fn, arrays, executor, fuse=name.startswith("fused"))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    for gg, wg in zip(grads, want_grads):
        if wg is None:                      # class indices
            assert gg is None
            continue
        np.testing.assert_allclose(gg, wg, rtol=1e-5, atol=1e-6)
    lowered = [k for k in g.plans[0].runnable_steps() if k.lowered]
    assert lowered or not ON_CPU, f"{name}: no node was lowered"


@cpu_only
def test_every_rule_has_a_case():
    """Each rule of kernel_ops is exercised above (a new rule needs a case)."""
    seen = set()
    for name, fn, shapes, _ in CASES:
        g = Fn(fn, "sequential", fuse=name.startswith("fused"))
        g(*[_leaf(a, True) for a in _inputs(shapes)])
        for k in g.plans[0].runnable_steps():
            if k.lowered and k.kind in ("call", "fn"):
                seen.add(kernel_ops.rule_for(k.node))
    missing = (set(kernel_ops.RULES.values()) | set(kernel_ops.FN_RULES.values())) - seen
    assert not missing, [getattr(r, "__name__", r) for r in missing]


@cpu_only
@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
def test_lowered_loss_checks_every_calls_targets(loss):
    """The lowered class-index losses check the targets of every call, with the
    Function's message."""
    fn = getattr(pf.nn.functional, loss)
    g = Fn(lambda x, t: fn(x, t), "sequential")
    x = pf.randn(5, 4, requires_grad=True)
    g(x, pf.tensor([0, 1, 2, 3, 0]))
    assert any(k.lowered and k.node.op_name in ("CrossEntropy", "NLLLoss")
               for k in g.plans[0].kernel_steps())
    with pytest.raises(IndexError, match=f"{loss}\\(\\): target 7 is out of bounds for 4 classes"):
        g(x, pf.tensor([0, 1, 7, 3, 0]))


@cpu_only
def test_lowered_embedding_checks_every_calls_indices():
    w = pf.randn(5, 4, requires_grad=True)
    g = Fn(lambda i: pf.nn.functional.embedding(i, w), "sequential")
    g(pf.tensor([0, 4]))
    assert any(k.lowered and k.node.op_name == "embedding" for k in g.plans[0].kernel_steps())
    with pytest.raises(IndexError, match="index 5 is out of range for num_embeddings=5"):
        g(pf.tensor([0, 5]))


@cpu_only
def test_float64_and_unlowered_dtypes():
    """float64 lowers too; an int tensor's op runs its Tensor-level step, right."""
    arrays = _inputs([(3, 4), (3, 4)], dtype=np.float64)
    want, want_grads = _eager(lambda a, b: a * b + a, arrays)
    got, grads, g = _graph(lambda a, b: a * b + a, arrays, "sequential")
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(grads[0], want_grads[0], rtol=1e-12)
    ints = pf.tensor(np.arange(12).reshape(3, 4))
    gi = Fn(lambda a: a * 3 + 1, "sequential", grads=False)
    np.testing.assert_array_equal(gi(ints).numpy(), np.arange(12).reshape(3, 4) * 3 + 1)
    assert not any(k.lowered for k in gi.plans[0].runnable_steps())


class _Calls:
    """Every Python function called while it is on, by name (sys.setprofile): a
    Tensor is made by ``Tensor._make``, ``host_tensor`` or ``_view_of``, a
    Context by its class, and a Function runs through its ``forward``/``apply``."""

    def __init__(self):
        self.names = []

    def __enter__(self):
        import sys

        def profile(frame, event, arg):
            if event == "call":
                code = frame.f_code
                self.names.append((code.co_name, code.co_filename))
        sys.setprofile(profile)
        return self

    def __exit__(self, *exc):
        import sys
        sys.setprofile(None)

    def count(self, *names):
        return sum(n in names for n, _ in self.names)

    def in_ops(self, *names):
        return [(n, f) for n, f in self.names if n in names and "/pyflow/ops/" in f]


@cpu_only
@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_lowered_step_makes_no_tensor_or_context_per_op(monkeypatch, executor):
    """A step of lowered ops (forward and backward) runs no Function (no forward,
    backward or apply of pyflow/ops) and makes no Context; it makes Tensors
    only at its edges (the returned output, the gradients set_grad stores in
    ``.grad``): as many for 3 blocks of 12 ops as for one."""
    contexts = []

    class CountingContext(autograd.Context):
        def __init__(self):
            contexts.append(self)
    made = {}
    for blocks in (1, 3):
        w1, w2 = pf.randn(8, 8, requires_grad=True), pf.randn(8, 8, requires_grad=True)

        class Step(pf.nn.Graph):
            def __init__(self):
                super().__init__()
                self.w1, self.w2 = w1, w2
                _configure(self, executor)

            def build(self, x):
                h = x
                for _ in range(blocks):
                    h = (((h @ self.w1).relu() * 0.5 + 1.0) @ self.w2).tanh() - x
                loss = h.sum() / 64.0
                loss.backward()
                return loss
        g = Step()
        x = pf.randn(4, 8)
        g(x)
        assert all(k.lowered for k in g.plans[0].runnable_steps()
                   if k.kind in ("call", "fn", "backward"))
        with monkeypatch.context() as m:
            m.setattr(autograd, "Context", CountingContext)
            from pyflow.distributed import dispatch
            m.setattr(dispatch, "Context", CountingContext)
            with _Calls() as calls:
                g(x)
        assert not contexts
        assert not calls.in_ops("forward", "backward", "apply"), calls.in_ops("forward")
        made[blocks] = calls.count("_make", "host_tensor", "_view_of")
    assert made[1] == made[3] <= 6, made


@cpu_only
@pytest.mark.parametrize("executor", EXECUTORS)
def test_buffers_are_reused_and_never_clobber_outputs(executor):
    """The lowered forwards write into the plan's buffers; what a call returned
    (and the gradients in .grad) stays as it was after the next call."""
    w = pf.randn(6, 6, requires_grad=True)

    class Step(pf.nn.Graph):
        def __init__(self):
            super().__init__()
            self.w = w
            _configure(self, executor)

        def build(self, x):
            h = (x @ self.w).relu() + 1.0
            out = h * h
            out.sum().backward()
            return out
    g = Step()
    x1, x2 = pf.randn(3, 6), pf.randn(3, 6)
    out1 = g(x1)
    grad1 = w.grad.numpy().copy()
    kept, kept_grad = out1.numpy().copy(), w.grad
    out2 = g(x2)
    np.testing.assert_array_equal(out1.numpy(), kept)
    np.testing.assert_array_equal(kept_grad.numpy(), grad1)
    h2 = np.maximum(x2.numpy() @ w.detach().numpy(), 0) + 1.0
    np.testing.assert_allclose(out2.numpy(), h2 * h2, rtol=1e-6)
    plan = g.plans[0]
    if executor != "actors-per-op":         # buffers need the nodes in graph order
        assert plan.buffer_bytes > 0
    assert "kernel plan:" in pf.explain(g)


@cpu_only
def test_opt_out_runs_every_node_through_its_function():
    x = pf.randn(3, 4)
    on = Fn(lambda a: a * 2.0 + 1.0, "sequential", grads=False)
    off = Fn(lambda a: a * 2.0 + 1.0, "sequential", kernel_plan=False, grads=False)
    np.testing.assert_array_equal(on(x).numpy(), off(x).numpy())
    assert all(not getattr(s, "lowered", False) for s in off.plans[0].runnable_steps())
    assert "kernel plan:" not in pf.explain(off)


def test_straight_line_inlines_templates_and_names_the_failing_member():
    """runtime.chains.straight_line: template items (input, input's ._data, a live
    attribute, a constant), drops, and an error naming the member that raised."""
    from pyflow.runtime.chains import ChainMemberError, straight_line

    class Box:
        _data = 10

    box = Box()

    def add3(a, b, c):
        return a + b + c
    add3.inline = (add3, [0, ("attr", box, "_data"), ("const", 100)])

    def boom(x):
        raise ValueError("bad value")
    plan = [("first", add3, (0,), 1, 1, (0,)),
            ("second", lambda x: x * 2, (1,), 2, 1, ())]
    fn = straight_line(plan, 1, (1, 2))
    assert fn(1) == (111, 222)
    box._data = 20                      # read at every call
    assert fn(1) == (121, 242)
    bad = straight_line(plan[:1] + [("second", boom, (1,), 2, 1, ())], 1, (2,))
    with pytest.raises(ChainMemberError) as info:
        bad(1)
    assert info.value.op == "second" and isinstance(info.value.exc, ValueError)
