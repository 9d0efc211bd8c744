"""Fused ops: several ops' arithmetic in one kernel pass, forward and backward.

Elementwise chains and row ops are memory-bound: each separate kernel reads
and writes whole tensors, so one kernel that keeps the intermediates in
registers does the same arithmetic for a fraction of the memory traffic.
OneFlow exposes such kernels as ``flow._C.fused_*`` and its graph passes
rewrite the unfused patterns into them; here they are ops like any other
(``pyflow.nn.functional.fused_*``), usable in eager mode, and the graph
passes build on the same ones:

* ``FusedElementwise``: any expression of elementwise ops as one generated
  kernel (``kernels/cpu/fused.py``, ``kernels/cuda/fused.py``); the graph's
  elementwise-fusion pass (``pyflow/graph/passes/fusion.py``) makes one
  subclass per expression it finds.
* ``fused_bias_add_gelu``: the transformer MLP's ``gelu(x + bias)``, one
  kernel forward and one backward that also sums the bias gradient
  (``kernels/cpu/bias_act.py``), which a generated elementwise kernel cannot.
* ``fused_bias_dropout_add``: ``dropout(x + bias) + residual`` as one kernel
  (``bias_dropout_add_philox``, the dropout kernel with the two adds in its
  loop) that draws the same mask ``F.dropout`` would for the same seed; its
  backward is dropout's masked scaling, the bias gradient a column sum.

The fused row ops live beside their unfused forms: ``rms_norm`` and
``fused_add_layer_norm`` in ``normalization.py``, ``fused_scale_mask_softmax``
in ``softmax.py``, and ``cross_entropy`` (``loss.py``) is already one fused
log-softmax + NLL kernel.  Each fused op gives the values of its unfused
composition (bit for bit where the kernels round op by op, as these do).
"""
import numbers

from .. import dtypes as _dt
from ..autograd import Function, enable_grad, is_grad_enabled
from ..autograd import grad as autograd_grad
from ..distributed.signatures import elementwise_rule
from ..random import generator_of
from ..tensor import Tensor
from ._util import check_tensor, compute_array, kernel, unbroadcast, wrap
from .dropout import MaskedScale, dropout
from .elementwise import gelu

__all__ = ["FusedElementwise", "fused_function", "FusedBiasGelu", "fused_bias_add_gelu",
           "FusedBiasDropoutAdd", "fused_bias_dropout_add"]

_FUSED_FLOATS = (_dt.float32, _dt.float64)


# ------------------------------------------------------------------ the fused op
class FusedElementwise(Function):
    """Base of the generated fused ops; subclasses set ``program`` and ``scalars``
    (see ``kernels/cpu/fused.py`` for the expression format)."""
    sbp_rule = elementwise_rule()
    program = ()
    scalars = ()

    @classmethod
    def _operands(cls, args):
        if len(args) != len(cls.scalars):
            raise TypeError(f"{cls.__name__}: expected {len(cls.scalars)} arguments, "
                            f"got {len(args)}")
        tensors = [a for a in args if isinstance(a, Tensor)]
        for i, (a, s) in enumerate(zip(args, cls.scalars)):
            if s != (not isinstance(a, Tensor)):
                raise TypeError(f"{cls.__name__}: argument {i} must be "
                                f"{'a number' if s else 'a Tensor'}, got {type(a).__name__}")
        first = tensors[0]
        for t in tensors[1:]:
            if t.dtype is not first.dtype or t.device != first.device:
                raise TypeError(f"{cls.__name__}: every tensor must be {first.dtype.name} on "
                                f"{first.device}, got {t.dtype.name} on {t.device}")
        return first.dtype, first.device

    @classmethod
    def forward(cls, ctx, *args):
        dtype, device = cls._operands(args)
        ctx.save_for_backward(*(a if isinstance(a, Tensor) else None for a in args))
        ctx.scalars = args
        operands = [compute_array(a, dtype) if isinstance(a, Tensor) else a for a in args]
        out = kernel("fused_elementwise", device.type)((cls.program, cls.scalars, None),
                                                       *operands)
        return wrap(out, dtype, device)

    @classmethod
    def backward(cls, ctx, g):
        if is_grad_enabled():
            raise RuntimeError(
                f"{cls.__name__} (a fused elementwise node) has no differentiable backward: "
                f"create_graph=True / double backward through it is not supported; compile "
                f"the graph without elementwise fusion")
        saved = ctx.saved_tensors
        args = [s if isinstance(a, Tensor) else a for s, a in zip(saved, ctx.scalars)]
        dtype, device = cls._operands(args)
        operands = [compute_array(g, dtype)] + [compute_array(a, dtype) if isinstance(a, Tensor)
                                                else a for a in args]
        run = kernel("fused_elementwise", device.type)
        needs = ctx.needs_input_grad
        used = {r for _, refs in cls.program for r in refs}
        same = cls._same_gradient()
        grads, done = [], {}
        for k, a in enumerate(args):
            if isinstance(a, Tensor) and k in used and (k >= len(needs) or needs[k]):
                full = done.get(same[k])
                if full is None:        # operands with one gradient program share its run
                    full = done[same[k]] = wrap(run((cls.program, cls.scalars, k), *operands),
                                                dtype, device)
                grads.append(unbroadcast(full, a.shape))
            else:
                grads.append(None)
        return tuple(grads)

    @classmethod
    def _same_gradient(cls):
        """{operand index: the first operand whose gradient program is the same}
        (``a + b``'s two operands, or ``relu(a + b)``'s): one kernel run serves
        them all, as eager's add hands one gradient to both of its inputs."""
        same = cls.__dict__.get("_same")
        if same is None:
            from ..kernels.cpu.fused import gradient_key     # pure: the generated source
            first = {}
            same = cls._same = {k: first.setdefault(
                gradient_key((cls.program, cls.scalars, k)), k)
                for k, s in enumerate(cls.scalars) if not s}
        return same


_classes = {}


def fused_function(program, scalars):
    """The ``FusedElementwise`` subclass of an expression (one per expression)."""
    key = (program, scalars)
    cls = _classes.get(key)
    if cls is None:
        name = "Fused[" + "+".join(op for op, _ in program) + "]"
        cls = _classes[key] = type(name, (FusedElementwise,),
                                   {"program": program, "scalars": scalars})
    return cls


# ------------------------------------------------------------------ bias + GELU
_GELU_OPS = {"none": "gelu", "tanh": "gelu_tanh"}


def _check_bias(op, input, bias, name="bias"):
    check_tensor(input, "input", op)
    check_tensor(bias, name, op)
    n = input.shape[-1] if input.ndim else None
    if bias.ndim != 1 or n is None or bias.shape[0] != n:
        raise ValueError(f"{op}(): '{name}' must be 1-D of input's last dim ({n},), got shape "
                         f"{tuple(bias.shape)} for input of shape {tuple(input.shape)}")
    if bias.dtype is not input.dtype or bias.device != input.device:
        raise TypeError(f"{op}(): '{name}' must be {input.dtype.name} on {input.device} like "
                        f"input, got {bias.dtype.name} on {bias.device}")


class FusedBiasGelu(Function):
    """gelu(x + bias) over x's last dim: one kernel forward, and one backward
    kernel giving dx and the bias gradient (its column sums taken in the same
    pass, ``kernels/cpu/bias_act.py``)."""
    sbp_rule = elementwise_rule()

    @staticmethod
    def forward(ctx, x, bias, approximate):
        dt = x.dtype
        out = kernel("bias_gelu", x.device.type)(compute_array(x, dt), compute_array(bias, dt),
                                                 approximate)
        ctx.approximate = approximate
        ctx.save_for_backward(x, bias)
        return wrap(out, dt, x.device)

    @staticmethod
    def backward(ctx, g):
        x, bias = ctx.saved_tensors
        if is_grad_enabled():                # double backward: the two ops, recorded
            with enable_grad():
                t = x + bias
                (dx,) = autograd_grad(gelu(t, approximate=ctx.approximate), t, g,
                                      create_graph=True)
            return dx, unbroadcast(dx, bias.shape), None
        dt = x.dtype
        dx, db = kernel("bias_gelu_backward", x.device.type)(
            compute_array(g, dt), compute_array(x, dt), compute_array(bias, dt), ctx.approximate)
        return wrap(dx, dt, x.device), wrap(db, dt, x.device), None


def fused_bias_add_gelu(input, bias, approximate="none"):
    """``gelu(input + bias, approximate)`` in one kernel, and one backward kernel
    that also sums the bias gradient (OneFlow's fused_bias_add_gelu).  ``bias``
    is 1-D, of input's last dim.  float32/float64 run fused; float16/bfloat16
    run the two ops (eager rounds after every op in those dtypes, which one
    float32 kernel would not)."""
    op = "fused_bias_add_gelu"
    _check_bias(op, input, bias)
    if approximate not in _GELU_OPS:
        raise ValueError(f"{op}(): approximate must be 'none' or 'tanh', got {approximate!r}")
    if input.dtype not in _FUSED_FLOATS or input.numel() == 0:
        return gelu(input + bias, approximate=approximate)
    return FusedBiasGelu.apply(input, bias, approximate)


# ------------------------------------------------------------------ bias + dropout + residual
class FusedBiasDropoutAdd(Function):
    """(x + bias) * keep / (1 - p) + residual; bias or residual may be None."""
    sbp_rule = elementwise_rule()

    @staticmethod
    def forward(ctx, x, bias, residual, p, seed):
        dt = x.dtype
        out, keep = kernel("bias_dropout_add_philox", x.device.type)(
            compute_array(x, dt), None if bias is None else compute_array(bias, dt),
            None if residual is None else compute_array(residual, dt), p, seed)
        ctx.keep, ctx.scale = keep, (0.0 if p == 1.0 else 1.0 / (1.0 - p))
        ctx.shape = x.shape
        return wrap(out, dt, x.device)

    @staticmethod
    def backward(ctx, g):
        needs = ctx.needs_input_grad
        if needs[1] and not is_grad_enabled():     # dx and db in one pass
            dt = g.dtype
            dx, db = kernel("dropout_bias_backward", g.device.type)(
                compute_array(g, dt), ctx.keep, ctx.scale)
            dx, db = wrap(dx, dt, g.device), wrap(db, dt, g.device)
        else:
            dx = MaskedScale.apply(g, ctx.keep, ctx.scale) if needs[0] or needs[1] else None
            db = unbroadcast(dx, (ctx.shape[-1],)) if needs[1] else None
        return dx if needs[0] else None, db, g if needs[2] else None, None, None


def fused_bias_dropout_add(input, bias, residual=None, p=0.5, training=True, generator=None):
    """``dropout(input + bias, p, training) + residual`` in one kernel pass
    (OneFlow's fused_bias_add_dropout with the residual add of a transformer
    block folded in).  ``bias`` (1-D, input's last dim) and ``residual``
    (input's shape) may be None.  float32/float64 run fused; float16/bfloat16
    run the three ops.  The mask is the one ``F.dropout`` draws for
    the same generator state, and the values are those of the three ops."""
    op = "fused_bias_dropout_add"
    check_tensor(input, "input", op)
    if bias is not None:
        _check_bias(op, input, bias)
    if residual is not None:
        check_tensor(residual, "residual", op)
        if tuple(residual.shape) != tuple(input.shape) or residual.dtype is not input.dtype \
                or residual.device != input.device:
            raise ValueError(f"{op}(): 'residual' must be {input.dtype.name} of input's shape "
                             f"{tuple(input.shape)} on {input.device}, got "
                             f"{residual.dtype.name} of shape {tuple(residual.shape)} on "
                             f"{residual.device}")
    if not isinstance(p, numbers.Real) or isinstance(p, bool) or not 0.0 <= p <= 1.0:
        raise ValueError(f"{op}(): p must be a number between 0 and 1, got {p!r}")
    if not input.dtype.is_floating_point:
        raise TypeError(f"{op}(): expected a floating point input, got {input.dtype}")
    gen = generator_of(generator)
    if not training or p == 0.0 or input.dtype not in _FUSED_FLOATS:
        # as F.dropout: no mask and no seed outside training; 16-bit dtypes run the
        # three ops, which round to 16 bits after each (the kernel would not)
        out = input if bias is None else input + bias
        out = dropout(out, p, training, generator=generator)
        return out if residual is None else out + residual
    return FusedBiasDropoutAdd.apply(input, bias, residual, float(p), gen.draw_seed())
