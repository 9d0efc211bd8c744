"""The elementwise fusion pass: what it groups, the generated fused op against
eager autograd and finite differences, a training graph with fusion against
eager, and the CUDA kernels (simulator in a child process, PTX for sm_80/90)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import pyflow as pf
from pyflow.graph import Graph, Node, Value, passes, trace
from pyflow.graph.executor import make_steps, run_sequential
from pyflow.graph.passes.fusion import (FusedElementwise, candidate, find_groups,
                                        fuse_elementwise, fused_function)
from pyflow.kernels import registry
from pyflow.ops import elementwise as ew
from tests.helpers import assert_close, broadcastable_pair, check_grad, layouts, make_input


def _fused_nodes(graph):
    return [n for n in graph.nodes if n.kind == "call" and issubclass(n.target, FusedElementwise)]


def _trace(fn, *inputs):
    return trace(fn, list(inputs))


# ------------------------------------------------------------------ what fuses
def test_a_chain_becomes_one_node_with_a_readable_name():
    w, b = pf.randn(5), pf.randn(5)
    g = _trace(lambda x: pf.gelu(x * w + b) * 0.5 + x, pf.randn(3, 5))
    f = fuse_elementwise(g)
    (node,) = f.nodes
    assert node.target.__name__ == "Fused[mul+add+gelu+mul+add]"
    assert node.outputs[0] is g.nodes[-1].outputs[0]          # the same result Value
    assert [v.name for v in node.inputs] == ["input0", "state0", "state1"]  # x once
    assert node.args[3] == 0.5
    assert f.history[-1] == ("fuse_elementwise", "fused 5 nodes into 1 kernels: "
                             "fused_add_4 = Fused[mul+add+gelu+mul+add]")
    assert len(g.nodes) == 5                                   # the input graph is unchanged


def test_an_intermediate_read_outside_the_group_or_returned_is_not_fused():
    def build(x):
        h = x * 2.0                  # read by exp and by sum: stays a node of its own
        y = pf.exp(h) + 1.0          # exp + add fuse
        r = pf.tanh(x) - 3.0         # r is returned: tanh + sub fuse, r stays visible
        return y, h.sum(), r, pf.sigmoid(r) * r
    f = fuse_elementwise(_trace(build, pf.randn(2, 3)))
    names = sorted(n.target.__name__ for n in _fused_nodes(f))
    assert names == ["Fused[exp+add]", "Fused[sigmoid+mul]", "Fused[tanh+sub]"]
    assert any(n.target is ew.Mul and n.outputs[0].name == "mul_0" for n in f.nodes)


def test_single_nodes_and_non_elementwise_ops_stay():
    g = _trace(lambda x: pf.exp(x).sum() + 1.0, pf.randn(4))
    assert find_groups(g) == []
    assert fuse_elementwise(g).history[-1] == ("fuse_elementwise", "fused 0 nodes into 0 kernels")


def test_mixed_dtypes_half_precision_and_tensor_exponents_are_not_fused():
    x32, x64 = pf.randn(3), pf.randn(3, dtype=pf.float64)
    g = _trace(lambda a, b: (a * 2.0) + b, x32, x64)            # float32 feeding float64
    assert candidate(g.nodes[1]) is None and find_groups(g) == []
    h = pf.randn(3).to(pf.float16)
    assert find_groups(_trace(lambda a: pf.exp(a * 2.0), h)) == []
    g = _trace(lambda a: pf.exp(a ** a), pf.rand(3) + 0.5)     # tensor exponent
    assert candidate(g.nodes[0]) is None
    g = _trace(lambda a: pf.exp(a ** 2), pf.randn(3))           # number exponent
    assert [n.target.__name__ for n in fuse_elementwise(g).nodes] == ["Fused[pow+exp]"]


def test_nodes_on_different_devices_are_not_fused():
    cpu, cuda = pf.device("cpu"), pf.device("cuda")
    exp = type("Exp", (ew._Unary,), {"name": "exp"})      # an elementwise Function like pf.exp's
    x = Value((3,), pf.float32, cpu, "input", name="x")

    def call(target, args, device):
        node = Node("call", target, args, {}, [], {"grad_enabled": True})
        node.outputs.append(Value((3,), pf.float32, device, "node", producer=node))
        return node
    n1 = call(ew.Mul, (x, 2.0), cpu)
    n2 = call(exp, (n1.outputs[0],), cuda)       # reads a cpu Value, writes a cuda one
    n3 = call(ew.Add, (n2.outputs[0], 1.0), cuda)
    assert candidate(n2) is None
    assert find_groups(Graph([n1, n2, n3], [x], n3.outputs[0], [])) == []
    n2 = call(exp, (n1.outputs[0],), cpu)
    n3 = call(ew.Add, (n2.outputs[0], 1.0), cpu)
    assert [len(m) for m in find_groups(Graph([n1, n2, n3], [x], n3.outputs[0], []))] == [3]


def test_the_loss_is_never_an_intermediate():
    w = pf.randn(3, requires_grad=True)

    def build(x):
        loss = ((x * w) ** 2).sum() * 0.5
        loss.backward()
        return pf.exp(loss)          # the loss is read by exp, but it is the loss
    f = fuse_elementwise(_trace(build, pf.randn(3)))
    assert [n.target.__name__ for n in _fused_nodes(f)] == ["Fused[mul+pow]"]


# ------------------------------------------------------------------ the fused op
OPS = ["add", "sub", "mul", "div", "pow", "maximum", "minimum", "neg", "exp", "log", "sqrt",
       "rsqrt", "abs", "sin", "cos", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "silu",
       "reciprocal"]
EAGER = {"add": pf.add, "sub": pf.sub, "mul": pf.mul, "div": pf.div, "pow": pf.pow,
         "maximum": pf.maximum, "minimum": pf.minimum, "neg": pf.neg, "exp": pf.exp,
         "log": pf.log, "sqrt": pf.sqrt, "rsqrt": pf.rsqrt, "abs": pf.abs, "sin": pf.sin,
         "cos": pf.cos, "tanh": pf.tanh, "sigmoid": pf.sigmoid, "relu": pf.relu,
         "gelu": pf.gelu, "gelu_tanh": lambda x: pf.gelu(x, approximate="tanh"),
         "silu": pf.silu, "reciprocal": pf.reciprocal}


def _expression(op):
    """``op(a * b, c) + a`` (``op(a * b) + a`` for unary ops, ``(a * b) ** 1.7 + a``
    for pow) as a fused Function and as eager ops."""
    if op == "pow" or op in ("add", "sub", "mul", "div", "maximum", "minimum"):
        scalars = (False, False, op == "pow")
        program = (("mul", (0, 1)), (op, (3, 2)), ("add", (4, 0)))

        def eager(a, b, c):
            return EAGER[op](a * b, c) + a
    else:
        scalars = (False, False)
        program = (("mul", (0, 1)), (op, (2,)), ("add", (3, 0)))

        def eager(a, b):
            return EAGER[op](a * b) + a
    return fused_function(program, scalars), eager


def _positive(op):
    return op in ("log", "sqrt", "rsqrt", "pow", "reciprocal", "div")


@pytest.mark.parametrize("op", OPS)
def test_fused_op_against_eager_and_finite_differences(op):
    cls, eager = _expression(op)
    rng = np.random.default_rng(1)
    lo = 0.5 if _positive(op) else -2.0
    a, b = rng.uniform(lo, 2.0, (3, 4)), rng.uniform(lo, 2.0, (4,))
    arrays = [a, b] + ([rng.uniform(lo, 2.0, (3, 1))] if len(cls.scalars) == 3 else [])
    extra = (1.7,) if op == "pow" else ()
    if op == "pow":
        arrays.pop()
    tensors = [pf.tensor(x) for x in arrays]
    assert_close(cls.apply(*tensors, *extra), eager(*tensors, *extra), rtol=1e-12, atol=1e-12)
    check_grad(lambda *xs: cls.apply(*xs, *extra), arrays)


@settings(max_examples=15, deadline=None)
@given(data=st.data(), op=st.sampled_from(["gelu", "div", "maximum", "sigmoid", "mul"]))
def test_fused_op_matches_eager_autograd_on_broadcast_and_strided_inputs(data, op):
    cls, eager = _expression(op)
    sa, sb = data.draw(broadcastable_pair(max_dims=3))
    la, lb, lc = data.draw(layouts()), data.draw(layouts()), data.draw(layouts())
    seed = data.draw(st.integers(0, 2 ** 16))
    low = 0.5 if _positive(op) else -2.0
    grads = []
    for fused in (True, False):                   # the same values both times
        ins = [make_input(np.random.default_rng(seed + k), s, lay, low=low)[1]
               .detach().requires_grad_()
               for k, (s, lay) in enumerate(((sa, la), (sb, lb), (sa[-1:], lc)))]
        ins = ins[:len(cls.scalars)]
        out = (cls.apply if fused else eager)(*ins)
        w = pf.tensor(np.random.default_rng(3).standard_normal(tuple(out.shape)))
        (out * w).sum().backward()
        grads.append([out.detach()] + [t.grad for t in ins])
    for got, want in zip(*grads):
        assert_close(got, want, rtol=1e-10, atol=1e-12)


def test_fused_op_float32_close_to_float64():
    cls, eager = _expression("gelu")
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s) for s in ((64, 33), (33,))]
    got = cls.apply(*[pf.tensor(a.astype(np.float32)) for a in arrays])
    want = eager(*[pf.tensor(a) for a in arrays])
    assert got.dtype is pf.float32
    assert_close(got, want, rtol=2e-5, atol=2e-6)


@pytest.mark.cpu_only      # the CPU kernel on NumPy arrays: the same run on any default device
@pytest.mark.parametrize("parallel", [False, True])
def test_cpu_fast_loop_equals_the_ufunc(parallel, monkeypatch):
    """Whole, row, column and 0-d operands take the generated loop; a
    transposed one the ufunc; both give the same numbers."""
    from pyflow.kernels.cpu import fused
    monkeypatch.setattr(fused, "PARALLEL_MIN", 1 if parallel else 1 << 62)
    program = (("mul", (0, 1)), ("add", (4, 2)), ("gelu", (5,)), ("div", (6, 3)))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 5))
    whole = rng.standard_normal((4, 32))       # coalesces to one row: cut into pieces
    cases = [(x, rng.standard_normal(5), rng.standard_normal((6, 1)), np.asarray(1.5)),
             (x, x.T.copy().T, rng.standard_normal(()), rng.uniform(1, 2, (5,))),
             (whole, whole + 1, np.asarray(0.5), rng.uniform(1, 2, (4, 32)))]
    run = registry.get("fused_elementwise", "cpu")
    for wrt in (None, 0, 3):
        expr = (program, (False,) * 4, wrt)
        for ops in cases:
            ops = ops if wrt is None else (rng.standard_normal(ops[0].shape),) + ops
            got = run(expr, *ops)
            assert_close(got, fused.ufunc(expr, np.float64)(*ops), rtol=1e-14, atol=1e-15)
    assert any(key[0][0] == program and key[3] == parallel for key in fused._loops)


def test_operands_with_one_gradient_program_share_one_kernel_run():
    """relu(a + b): both operands' gradient is relu'(a + b) * g, computed once
    (as eager's add hands one gradient to both inputs); a * b's are different."""
    from pyflow.graph.passes.fusion import fused_function
    add_relu = fused_function((("add", (0, 1)), ("relu", (2,))), (False, False))
    assert add_relu._same_gradient() == {0: 0, 1: 0}
    assert fused_function((("mul", (0, 1)),), (False, False))._same_gradient() == {0: 0, 1: 1}
    rng = np.random.default_rng(4)
    a, b = (pf.tensor(rng.standard_normal((3, 4)), requires_grad=True) for _ in range(2))
    add_relu.apply(a, b).sum().backward()
    want = (a.detach().cpu().numpy() + b.detach().cpu().numpy() > 0).astype(np.float64)
    np.testing.assert_array_equal(a.grad.cpu().numpy(), want)
    np.testing.assert_array_equal(b.grad.cpu().numpy(), want)


def test_double_backward_through_a_fused_node_is_refused():
    cls, _ = _expression("tanh")
    xs = [pf.randn(3, dtype=pf.float64, requires_grad=True) for _ in range(2)]
    out = cls.apply(*xs).sum()
    with pytest.raises(RuntimeError, match="no differentiable backward"):
        pf.autograd.grad(out, xs[0], create_graph=True)


def test_bad_arguments_raise_clear_errors():
    cls, _ = _expression("maximum")
    x = pf.randn(3)
    with pytest.raises(TypeError, match="expected 3 arguments, got 2"):
        cls.apply(x, x)
    with pytest.raises(TypeError, match="argument 1 must be a Tensor"):
        cls.apply(x, 2.0, x)
    with pytest.raises(TypeError, match="every tensor must be float32"):
        cls.apply(x, x.double(), x)
    run = registry.get("fused_elementwise", "cpu")
    a = np.ones(3)
    with pytest.raises(ValueError, match="unknown op 'floor'"):
        run(((("floor", (0,)),), (False,), None), a)
    with pytest.raises(ValueError, match="refers to"):
        run(((("exp", (1,)),), (False,), None), a)
    with pytest.raises(TypeError, match="share one dtype"):
        run(((("add", (0, 1)),), (False, False), None), a, a.astype(np.float32))
    with pytest.raises(TypeError, match="float32 or float64"):
        run(((("exp", (0,)),), (False,), None), np.ones(3, np.int64))
    with pytest.raises(ValueError, match="not broadcastable"):
        run(((("add", (0, 1)),), (False, False), None), a, np.ones(4))


# ------------------------------------------------------------------ a training graph
class ResidualMLP(pf.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = pf.nn.Linear(6, 16)
        self.fc2 = pf.nn.Linear(16, 16)
        self.out = pf.nn.Linear(16, 3)

    def forward(self, x):
        h = self.fc1(x)
        h = h + 0.5 * pf.gelu(self.fc2(h))          # residual x + 0.5 * f(x)
        return self.out(pf.nn.functional.gelu(h))


def _compile(build, inputs):
    g = trace(build, inputs)
    for p in (fuse_elementwise, passes.autograd, passes.constant_folding,
              passes.dead_code_elimination, passes.plan_memory):
        g = p(g)
    return g


def test_training_graph_with_fusion_matches_eager_over_three_sgd_steps():
    pf.manual_seed(0)
    eager = ResidualMLP()
    pf.manual_seed(0)
    graphed = ResidualMLP()
    o1 = pf.optim.SGD(eager.parameters(), lr=0.1)
    o2 = pf.optim.SGD(graphed.parameters(), lr=0.1)

    def build(x, y):
        loss = ((graphed(x) - y) ** 2).mean()
        loss.backward()
        return loss
    rng = np.random.default_rng(0)
    batches = [(pf.tensor(rng.standard_normal((8, 6)).astype(np.float32)),
                pf.tensor(rng.standard_normal((8, 3)).astype(np.float32))) for _ in range(3)]
    graph = _compile(build, list(batches[0]))
    fused = sorted(n.target.__name__ for n in _fused_nodes(graph))
    assert fused == ["Fused[gelu+mul+add+gelu]", "Fused[sub+pow]"], fused
    steps = make_steps(graph)
    for x, y in batches:
        o1.zero_grad()
        l1 = ((eager(x) - y) ** 2).mean()
        l1.backward()
        o1.step()
        o2.zero_grad()
        l2 = run_sequential(graph, steps, [x, y], graph.memory.release)
        o2.step()
        np.testing.assert_allclose(float(l2), float(l1), rtol=1e-5)
    for (name, p1), p2 in zip(eager.named_parameters(), graphed.parameters()):
        assert_close(p2, p1, rtol=1e-5, atol=1e-6, msg=name)


# ------------------------------------------------------------------ CUDA kernels
@pytest.mark.cpu_only       # starts its own simulator process: once, in the CPU run, is enough
def test_cuda_fused_kernels_in_the_simulator():
    from tests.kernels.cudatools import run_in_simulator
    run_in_simulator("cudasim_fused.py", timeout=300)


@pytest.mark.cpu_only       # NVVM is not there when NUMBA_ENABLE_CUDASIM=1
def test_a_generated_cuda_fused_kernel_compiles_to_ptx(monkeypatch):
    from pyflow.kernels.cuda import fused
    from tests.kernels.cudatools import compile_ptx_all
    program = (("mul", (0, 1)), ("add", (4, 2)), ("gelu", (5,)), ("mul", (6, 3)),
               ("add", (7, 0)))
    for wrt in (None, 0):
        expr = (program, (False, False, False, True), wrt)
        for layout in fused.LAYOUTS:
            for dtype in (np.float32, np.float64):
                ptxes = compile_ptx_all(fused.kernel_function(expr, dtype, layout),
                                        fused.kernel_signature(expr, dtype, layout), monkeypatch)
                for (major, minor), ptx in ptxes.items():
                    if dtype == np.float32:        # float32 math must stay float32
                        assert not [ln for ln in ptx.splitlines() if ".f64" in ln], \
                            f"sm_{major}{minor}: {describe(expr)}"


def describe(expr):
    from pyflow.kernels.cpu.fused import describe as d
    return d(expr)
