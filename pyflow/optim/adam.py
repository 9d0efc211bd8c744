"""Adam and AdamW (torch.optim.Adam / AdamW): bias-corrected moments, amsgrad,
L2 (Adam) or decoupled (AdamW) weight decay, maximize.

The state per parameter is torch's: ``step`` (a float32 0-dim tensor),
``exp_avg``, ``exp_avg_sq`` and, with amsgrad, ``max_exp_avg_sq``.
"""
from .. import dtypes as _dt
from ..autograd import no_grad
from ..ops._util import kernel
from ..ops.creation import tensor
from ..tensor import Tensor
from .optimizer import (FlatParam, Optimizer, flat_grad, flat_state, next_step, scalar_value,
                        zeros_state)

__all__ = ["Adam", "AdamW"]


class Adam(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, *, foreach=None, maximize=False, capturable=False,
                 differentiable=False, fused=None, decoupled_weight_decay=False):
        # foreach/fused/capturable are accepted for torch compatibility: step()
        # already runs fused kernels, one call per dtype and device (multi-tensor).
        if differentiable:
            raise NotImplementedError(f"{type(self).__name__}: differentiable=True (autograd "
                                      f"through the optimizer step) is not supported")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        defaults = dict(lr=lr, betas=tuple(float(b) for b in betas), eps=eps,
                        weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        foreach=foreach, capturable=capturable, differentiable=differentiable,
                        fused=fused, decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, defaults)

    def _check_group(self, group):
        """torch.optim.Adam's argument checks, with its messages."""
        lr, eps, betas, wd = group["lr"], group["eps"], group["betas"], group["weight_decay"]
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= eps:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 0: {betas[0]}")
        if not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameter at index 1: {betas[1]}")
        if not 0.0 <= wd:
            raise ValueError(f"Invalid weight_decay value: {wd}")

    @no_grad()
    def step(self, closure=None):
        loss = self._run_closure(closure)
        self._update_all()
        return loss

    # One parameter's step (graph mode's per-parameter update nodes, with
    # allow_fuse_model_update_ops(False)) and many parameters' in one
    # multi-tensor kernel (``step``, and graph mode's fused update node); both
    # do the same arithmetic.
    def _prepare(self, group, p):
        """Advance p's step count; (FlatParam, flat grad, exp_avg, exp_avg_sq,
        max_exp_avg_sq or None, hyperparameters, flags)."""
        amsgrad = group["amsgrad"]
        state = self.state[p]
        if len(state) == 0:
            state["step"] = tensor(0.0, dtype=_dt.float32)
            state["exp_avg"] = zeros_state(p)
            state["exp_avg_sq"] = zeros_state(p)
            if amsgrad:
                state["max_exp_avg_sq"] = zeros_state(p)
        elif amsgrad and "max_exp_avg_sq" not in state:  # amsgrad switched on later
            state["max_exp_avg_sq"] = zeros_state(p)
        step_t = state["step"]
        if not isinstance(step_t, Tensor):  # a plain number from an old checkpoint
            step_t = state["step"] = tensor(float(step_t), dtype=_dt.float32)
        beta1, beta2 = group["betas"]
        hparams = (next_step(step_t), scalar_value(group["lr"]), beta1, beta2, group["eps"],
                   group["weight_decay"])
        return (FlatParam(p), flat_grad(p), flat_state(state, "exp_avg"),
                flat_state(state, "exp_avg_sq"),
                flat_state(state, "max_exp_avg_sq") if amsgrad else None, hparams,
                (amsgrad, group["maximize"], group["decoupled_weight_decay"]))

    def _update_param(self, group, p):
        if p.grad is None:
            return
        flat, grad, m, v, vmax, hparams, (amsgrad, maximize, decoupled) = self._prepare(group, p)
        step, lr, beta1, beta2, eps, wd = hparams
        kernel("adam_step", p.device.type)(
            flat.array, grad, m, v, vmax, step=step, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
            weight_decay=wd, amsgrad=amsgrad, maximize=maximize,
            decoupled_weight_decay=decoupled)
        flat.write_back()

    def _update_params(self, pairs):
        """``(group, param)`` pairs, all of one compute dtype and device."""
        jobs = [self._prepare(g, p) for g, p in pairs if p.grad is not None]
        if not jobs:
            return
        kernel("adam_multi_step", pairs[0][1].device.type)(
            *([j[0].array for j in jobs],) + tuple([j[k] for j in jobs] for k in range(1, 7)))
        for j in jobs:
            j[0].write_back()


class AdamW(Adam):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, foreach=None, capturable=False,
                 differentiable=False, fused=None):
        super().__init__(params, lr, betas, eps, weight_decay, amsgrad, foreach=foreach,
                         maximize=maximize, capturable=capturable,
                         differentiable=differentiable, fused=fused,
                         decoupled_weight_decay=True)
