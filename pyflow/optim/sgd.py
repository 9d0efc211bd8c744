"""SGD with momentum, dampening, Nesterov, weight decay and maximize (torch.optim.SGD)."""
from ..autograd import no_grad
from ..ops._util import kernel
from .optimizer import FlatParam, Optimizer, flat_grad, flat_state, scalar_value, zeros_state

__all__ = ["SGD"]


class SGD(Optimizer):
    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
                 nesterov=False, *, maximize=False, foreach=None, differentiable=False,
                 fused=None):
        # foreach/fused are accepted for torch compatibility: step() already runs
        # fused kernels, one call per dtype and device (multi-tensor).
        if differentiable:
            raise NotImplementedError("SGD: differentiable=True (autograd through the "
                                      "optimizer step) is not supported")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize,
                        foreach=foreach, differentiable=differentiable, fused=fused)
        super().__init__(params, defaults)

    def _check_group(self, group):
        """torch.optim.SGD's argument checks, with its messages."""
        lr, momentum, wd = group["lr"], group["momentum"], group["weight_decay"]
        if not 0.0 <= lr:
            raise ValueError(f"Invalid learning rate: {lr}")
        if not 0.0 <= momentum:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if not 0.0 <= wd:
            raise ValueError(f"Invalid weight_decay value: {wd}")
        if group["nesterov"] and (momentum <= 0 or group["dampening"] != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")

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
        """(FlatParam, flat grad, momentum buffer or None, hyperparameters, flags)."""
        momentum = group["momentum"]
        state = self.state[p]
        first = False
        buf = None
        if momentum != 0:
            if state.get("momentum_buffer") is None:
                state["momentum_buffer"] = zeros_state(p)
                first = True
            buf = flat_state(state, "momentum_buffer")
        hparams = (scalar_value(group["lr"]), momentum, group["dampening"],
                   group["weight_decay"])
        return (FlatParam(p), flat_grad(p), buf, hparams,
                (group["nesterov"], group["maximize"], first))

    def _update_param(self, group, p):
        if p.grad is None:
            return
        flat, grad, buf, (lr, momentum, dampening, wd), (nesterov, maximize, first) = \
            self._prepare(group, p)
        kernel("sgd_step", p.device.type)(
            flat.array, grad, buf, lr=lr, momentum=momentum, dampening=dampening,
            weight_decay=wd, nesterov=nesterov, maximize=maximize, first_step=first)
        flat.write_back()

    def _update_params(self, pairs):
        """``(group, param)`` pairs, all of one compute dtype and device."""
        jobs = [self._prepare(g, p) for g, p in pairs if p.grad is not None]
        if not jobs:
            return
        kernel("sgd_multi_step", pairs[0][1].device.type)(
            [j[0].array for j in jobs], [j[1] for j in jobs], [j[2] for j in jobs],
            [j[3] for j in jobs], [j[4] for j in jobs])
        for j in jobs:
            j[0].write_back()
