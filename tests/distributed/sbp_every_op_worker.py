"""Run under ``mpirun -n N python sbp_every_op_worker.py``: op by op, every
autograd Function of ``pyflow.ops`` on global tensors under every input SBP,
forward and backward, against the single-rank result (``run_case`` of
sbp_ops_worker.py, which tests the op families and their deduction).

``CASES`` names one call per Function class (each unary elementwise op by
itself; the random ones at p = 1); a class that is only ever created by
another op's backward is listed in ``HELPERS`` with the op whose backward
creates it, and what is not an SBP op in ``ELSEWHERE``.  The first check fails when a
Function class is in none of them, so a new op cannot skip this sweep.
Ends with ``rank r: N checks, F failures``.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from tests.distributed.sbp_ops_worker import F, SIZE, check, pyflow, run_case  # noqa: E402

from pyflow.autograd import Function  # noqa: E402
from pyflow.ops import elementwise as ew  # noqa: E402
from pyflow.ops.attention import FusedAttention  # noqa: E402
from pyflow.ops.fused import FusedBiasDropoutAdd, fused_function  # noqa: E402
from pyflow.ops.loss import TargetWeightSum  # noqa: E402
from pyflow.ops.normalization import (BatchNormStats, fused_add_layer_norm,  # noqa: E402
                                     fused_batch_norm_add_relu, rms_norm)
from pyflow.ops.softmax import (fused_scale_mask_softmax,  # noqa: E402
                                fused_scale_mask_softmax_dropout)

n = SIZE


def running_after_batch_norm(x, r):
    """The running mean a training batch_norm leaves (plus the output's channel
    means, so a gradient flows back to x)."""
    running = r.detach().clone()
    y = F.batch_norm(x, running, None, training=True, momentum=0.3)
    return running * r + y.mean((0, 2))


def positive(a):
    return a.abs() + 0.5


# Function class name -> (call, input shapes, integer inputs[, rtol]); one row per class.
CASES = {
    "Sum": (lambda a: a.sum(1), [(n, 2 * n)], ()),
    "Mean": (lambda a: a.mean(0), [(2 * n, n)], ()),
    "Prod": (lambda a: positive(a).prod(1), [(n, 2 * n)], ()),
    "_AExtreme": (lambda a: a.amax(1) - a.amin(0).sum(), [(n, 2 * n)], ()),
    "_ExtremeDim": (lambda a: a.max(1).values + a.min(0).values.sum(), [(n, 2 * n)], ()),
    "VarStd": (lambda a: a.var(1) + a.std(0).sum(), [(n, 2 * n)], ()),
    "Norm": (lambda a: a.norm(dim=1), [(n, 2 * n)], ()),
    "LogSumExp": (lambda a: a.logsumexp(1), [(n, 2 * n)], ()),
    "_Scan": (lambda a: a.cumsum(1), [(n, 2 * n)], ()),
    # float32 rounds each partial-sum piece on its own: equal to float32 precision
    "Cast": (lambda a: a.to(pyflow.float32).to(pyflow.float64), [(n, 2 * n)], (), 1e-6),
    "Clone": (lambda a: a.clone(), [(n, 2 * n)], ()),
    "View": (lambda a: a.view(2 * n, n), [(n, 2 * n)], ()),
    "Permute": (lambda a: a.permute(1, 0), [(n, 2 * n)], ()),
    "Expand": (lambda a: a.expand(n, 2 * n), [(1, 2 * n)], ()),
    "SliceView": (lambda a: a[:, 1:], [(n, 2 * n)], ()),
    "Split": (lambda a: pyflow.cat([p * (i + 1) for i, p in enumerate(a.split([1, 2 * n - 1], 1))],
                                   1) + pyflow.cat([p * (i + 3) for i, p in enumerate(a.chunk(2, 0))], 0),
              [(2 * n, 2 * n)], ()),
    "Conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1), [(n, 2, 4, 4), (n, 2, 3, 3), (n,)],
               ()),
    "MaxPool2d": (lambda x: F.max_pool2d(x, 2), [(n, 2, 4, 4)], ()),
    "AvgPool2d": (lambda x: F.avg_pool2d(x, 2), [(n, 2, 4, 4)], ()),
    "Add": (lambda a, b: a + b, [(n, 2 * n), (2 * n,)], ()),
    "Sub": (lambda a, b: a - b, [(n, 2 * n), (n, 1)], ()),
    "Mul": (lambda a, b: a * b, [(n, 2 * n), (n, 2 * n)], ()),
    "Div": (lambda a, b: a / positive(b), [(n, 2 * n), (n, 2 * n)], ()),
    "Pow": (lambda a, b: positive(a) ** b, [(n, 2 * n), (n, 2 * n)], ()),
    "_MaxMin": (lambda a, b: pyflow.maximum(a, b) + pyflow.minimum(a, b) * 2.0,
                [(n, 2 * n), (n, 2 * n)], ()),
    "Remainder": (lambda a: pyflow.remainder(a, 0.7), [(n, 2 * n)], ()),
    "_Erf": (lambda a: F.gelu(a), [(n, 2 * n)], ()),
    "Where": (lambda a, b: pyflow.where(a > 0, a, b), [(n, 2 * n), (n, 2 * n)], ()),
    "Clamp": (lambda a: a.clamp(-0.5, 0.5), [(n, 2 * n)], ()),
    "Embedding": (lambda i, w: F.embedding(i, w), [(n, 2), (5, n)], (0,)),
    "Index": (lambda a, i: a[i], [(5, n), (n,)], (1,)),
    "IndexPut": (lambda a, i, v: a.index_put((i,), v, accumulate=True),
                 [(5, n), (n,), (n, n)], (1,)),
    "Gather": (lambda a, i: pyflow.gather(a, 1, i), [(n, 5), (n, 2)], (1,)),
    "ScatterAdd": (lambda a, i, v: pyflow.scatter_add(a, 1, i, v),
                   [(n, 5), (n, 2), (n, 2)], (1,)),
    "IndexSelect": (lambda a, i: pyflow.index_select(a, 0, i), [(5, n), (n,)], (1,)),
    "IndexAdd": (lambda a, i, v: a.index_add(0, i, v), [(5, n), (n,), (n, n)], (1,)),
    "Cat": (lambda a, b: pyflow.cat([a, b], 1), [(n, 2), (n, 2)], ()),
    "_Triangle": (lambda a: pyflow.triu(a) + pyflow.tril(a, -1) * 2.0, [(2 * n, 2 * n)], ()),
    "PadConstant": (lambda a: F.pad(a, (1, 2)), [(n, 2 * n)], ()),
    "Repeat": (lambda a: a.repeat(2, 1), [(n, 2 * n)], ()),
    "Flip": (lambda a: a.flip(0), [(n, 2 * n)], ()),
    "Roll": (lambda a: a.roll(1, 1), [(n, 2 * n)], ()),
    "Matmul": (lambda a, b: a @ b, [(2 * n, n), (n, 2 * n)], ()),
    "Linear": (lambda x, w, b: F.linear(x, w, b), [(n, 2 * n), (n, 2 * n), (n,)], ()),
    "CrossEntropy": (lambda x, t: F.cross_entropy(x, t).reshape(1), [(2 * n, 5), (2 * n,)],
                     (1,)),
    "TargetWeightSum": (lambda t, w: TargetWeightSum.apply(t, w, 3, pyflow.float64).reshape(1)
                        * w.sum(), [(2 * n,), (5,)], (0,)),
    "NLLLoss": (lambda x, t: F.nll_loss(F.log_softmax(x, 1), t).reshape(1),
                [(2 * n, 5), (2 * n,)], (1,)),
    "BCEWithLogits": (lambda x, y: F.binary_cross_entropy_with_logits(x, y.sigmoid()).reshape(1),
                      [(n, 2 * n), (n, 2 * n)], ()),
    "LayerNorm": (lambda x, w, b: F.layer_norm(x, (2 * n,), w, b), [(n, 2 * n), (2 * n,),
                                                                      (2 * n,)], ()),
    "BatchNorm": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                  [(2 * n, n, 2), (n,), (n,)], ()),
    # training (batch statistics) plus eval (w and b, detached, as running statistics)
    "BatchNormAddRelu": (lambda x, a, w, b: fused_batch_norm_add_relu(
        x, a, None, None, w, b, training=True) + fused_batch_norm_add_relu(
        x, a, w.detach(), positive(b).detach(), w, b), [(2 * n, n, 2), (2 * n, n, 2), (n,), (n,)],
        ()),
    "BatchNormStats": (lambda x: sum(BatchNormStats.apply(x)) + x.mean((0, 2)),
                       [(2 * n, n, 2)], ()),
    "RunningAverage": (lambda x, r: running_after_batch_norm(x, r), [(2 * n, n, 2), (n,)], ()),
    "_SoftmaxBase": (lambda a: F.softmax(a, -1) + F.log_softmax(a, 0)
                     + F.scaled_dot_product_attention(a, a, a, is_causal=True), [(n, 2 * n)], ()),
    "FusedAttention": (lambda q, k, v: FusedAttention.apply(q, k, v, None, 0.5, True),
                       [(n, 3, 4), (n, 3, 4), (n, 3, 2)], ()),
    "Dropout": (lambda x: F.dropout(x, 1.0) + x, [(n, 2 * n)], ()),
    "RMSNorm": (lambda x, w: rms_norm(x, (2 * n,), w), [(n, 2 * n), (2 * n,)], ()),
    "FusedAddLayerNorm": (lambda x, r, w, b: pyflow.stack(list(fused_add_layer_norm(
        x, r, (2 * n,), w, b))), [(n, 2 * n), (n, 2 * n), (2 * n,), (2 * n,)], ()),
    "FusedScaleMaskSoftmax": (lambda x: fused_scale_mask_softmax(
        x, pyflow.tensor([[True, False] * n] * n), 0.5), [(n, 2 * n)], ()),
    # p = 1: every element dropped whatever a piece's mask (random masks: ELSEWHERE)
    "FusedScaleMaskSoftmaxDropout": (lambda x: pyflow.stack(list(
        fused_scale_mask_softmax_dropout(x, pyflow.tensor([[True, False] * n] * n), 0.5,
                                         p=1.0))), [(n, 2 * n)], ()),
    "FusedElementwise": (lambda x, b: fused_function((("mul", (0, 1)), ("tanh", (2,))),
                                                     (False, False)).apply(x, b),
                         [(n, 2 * n), (2 * n,)], ()),
    "FusedBiasGelu": (lambda x, b: F.fused_bias_add_gelu(x, b), [(n, 2 * n), (2 * n,)], ()),
    # p = 1 keeps no element on any rank, so the result (x + b) * 0 + r and its
    # gradients are the same whatever mask a piece draws (random masks: ELSEWHERE)
    "FusedBiasDropoutAdd": (lambda x, b, r: FusedBiasDropoutAdd.apply(x, b, r, 1.0, 5),
                            [(n, 2 * n), (2 * n,), (n, 2 * n)], ()),
}
# Created only by another op's backward (the op named), so swept with it.
HELPERS = {"SliceScatter": "SliceView", "Conv2dInputGrad": "Conv2d",
           "Conv2dWeightGrad": "Conv2d", "PoolScatter": "MaxPool2d", "PoolGather": "MaxPool2d",
           "AvgPool2dBackward": "AvgPool2d", "EmbeddingBackward": "Embedding",
           "IndexAccumulate": "Index", "NLLLossBackward": "NLLLoss", "_Unary": "every unary op",
           "MaskedScale": "Dropout"}
# Random or device ops, tested elsewhere (their masks must agree across ranks).
# (A random op's mask on a split piece is drawn from that piece's own element
# indices, so for 0 < p < 1 it differs from one rank's: the sweep runs the
# dropout ops at p = 1, where no element is kept whatever the mask.)
ELSEWHERE = {"ToDevice": "not an SBP op: a device copy"}
DOMAIN = {"log": positive, "sqrt": positive, "rsqrt": positive, "reciprocal": positive}


def op_classes():
    """Function subclasses defined in pyflow.ops, direct ones (the op families)."""
    return {c.__name__ for c in Function.__subclasses__() if c.__module__.startswith("pyflow.ops")}


def coverage():
    missing = op_classes() - set(CASES) - set(HELPERS) - set(ELSEWHERE)
    assert not missing, f"Function classes with no SBP sweep case: {sorted(missing)}"


def unary(name):
    fn = getattr(pyflow, name, None) or getattr(F, name)
    dom = DOMAIN.get(name, lambda a: a)
    # sign's gradient is zero everywhere (a tensor of zeros), so backward is checked too
    run_case(f"unary {name}", lambda a: fn(dom(a)), [(n, 2 * n)])


def in_place(a, i, v):
    """In-place writes keep a global tensor's layout (its piece of the result)."""
    out = a.clone()
    out[i] = v
    out.index_add_(0, i, v)
    out[:, :1] += 1.0
    return out


check("every Function class of pyflow.ops has a sweep case", coverage)
run_case("in-place setitem / index_add_ / +=", in_place, [(5, n), (n,), (n, n)], int_inputs=(1,),
         grads=False)
for cls_name, (fn, shapes, ints, *rtol) in CASES.items():
    run_case(cls_name, fn, shapes, int_inputs=ints, rtol=rtol[0] if rtol else 1e-9)
for name in sorted({c.name for c in ew._Unary.__subclasses__()}):
    unary(name if name != "gelu_tanh" else "gelu")
check.report_and_exit()
