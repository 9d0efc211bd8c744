"""GradScaler: dynamic loss scaling, as ``torch.amp.GradScaler``.

Half-precision gradients underflow to zero when they are small; multiplying the
loss by a large scale before ``backward`` keeps them representable.  Before the
optimizer steps, the gradients are divided by that scale again ("unscaled") and
checked for inf/nan: an overflow means the scale was too large, so the step is
skipped and the scale shrinks by ``backoff_factor``; after ``growth_interval``
clean steps in a row it grows by ``growth_factor``.

The scale is a float32 value (torch keeps it in a float32 tensor) and every
rule follows torch: ``unscale_`` at most once per optimizer between updates,
``step`` unscales if that was not done, ``update`` combines the inf checks of
every optimizer stepped since the last update.  With ``enabled=False`` every
method passes through.  ``last_step_skipped`` (not in torch) tells whether the
last ``step`` skipped ``optimizer.step`` (torch only shows it as a smaller scale).

The unscale and the inf check of all an optimizer's gradients are one call of
the ``amp_unscale_check`` kernel per device type: on the CPU one multi-tensor
numba kernel (kernels/cpu/amp.py), on "cuda" one numba.cuda launch per
gradient sharing one device flag (kernels/cuda/amp.py).
"""
import math
import warnings
from enum import Enum

import numpy as np

from .. import dtypes as _dt
from ..device import backend_of, device as _device_cls
from ..ops._util import kernel
from ..ops.creation import tensor
from ..tensor import Tensor

__all__ = ["GradScaler", "OptState"]


class OptState(Enum):
    """Where an optimizer is in the current iteration (torch's stages)."""
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_state():
    return {"stage": OptState.READY, "found_inf": None}


def _check_growth_factor(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 1.0 \
            or not math.isfinite(value):
        raise ValueError(f"GradScaler: growth_factor must be a finite number > 1.0, "
                         f"got {value!r}")


def _check_backoff_factor(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not 0.0 < value < 1.0:
        raise ValueError(f"GradScaler: backoff_factor must be a number in (0, 1), "
                         f"got {value!r}")


def _check_growth_interval(value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"GradScaler: growth_interval must be a positive int, got {value!r}")


def _f32(x):
    """``x`` rounded to float32, as a Python float (the scale's precision)."""
    return float(np.float32(x))


class GradScaler:
    """Scales the loss, unscales gradients, skips steps whose gradients overflowed.

    Typical iteration::

        scaler.scale(loss).backward()
        scaler.step(optimizer)      # unscales, skips on inf/nan
        scaler.update()             # backoff or growth of the scale
    """

    def __init__(self, device="cpu", init_scale=2.0 ** 16, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000, enabled=True):
        dev_type = device.type if isinstance(device, _device_cls) else device
        if dev_type not in ("cpu", "cuda"):
            raise ValueError(f"GradScaler: device must be 'cpu' or 'cuda', got {device!r}")
        self._device = dev_type
        self._enabled = bool(enabled)
        if dev_type == "cuda" and self._enabled:
            if backend_of("cuda").unavailable_reason() is not None:    # cuda.is_available()
                warnings.warn("pyflow.amp.GradScaler is enabled, but CUDA is not "
                              "available.  Disabling.", stacklevel=2)
                self._enabled = False
        self._last_step_skipped = None
        if not self._enabled:
            return
        if isinstance(init_scale, bool) or not isinstance(init_scale, (int, float)) \
                or not 0.0 < init_scale < math.inf:
            raise ValueError(f"GradScaler: init_scale must be a finite number > 0, "
                             f"got {init_scale!r}")
        _check_growth_factor(growth_factor)
        _check_backoff_factor(backoff_factor)
        _check_growth_interval(growth_interval)
        self._init_scale = float(init_scale)
        self._scale = None              # float32 value, set by the first scale()
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._per_optimizer_states = {}

    # ------------------------------------------------------------- scaling
    def scale(self, outputs):
        """``outputs`` (a Tensor, or a list/tuple/iterable of them, nested) times
        the scale, as a float32 0-dim tensor (so a 0-dim half loss becomes
        float32, as in torch).  Returned unchanged when disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            return outputs * self._scale_on(outputs.device)
        cache = {}

        def apply(val):
            if isinstance(val, Tensor):
                key = str(val.device)
                if key not in cache:
                    cache[key] = self._scale_on(val.device)
                return val * cache[key]
            if isinstance(val, (list, tuple)):
                return type(val)(apply(v) for v in val)
            if hasattr(val, "__iter__") and not isinstance(val, (str, bytes, dict)):
                return map(apply, val)
            raise ValueError("outputs must be a Tensor or an iterable of Tensors")
        return apply(outputs)

    def _scale_on(self, dev):
        return tensor(self._scale_value(), dtype=_dt.float32, device=dev)

    def _scale_value(self):
        """The factor ``scale`` multiplies by (1.0 when disabled): the scale, set
        from ``init_scale`` on first use.  A graph's backward seed reads it
        (``Graph.set_grad_scaler``), since build() calls ``loss.backward()``."""
        if not self._enabled:
            return 1.0
        if self._scale is None:
            self._scale = _f32(self._init_scale)
        return self._scale

    def _require_scale(self, funcname):
        if self._scale is None:
            raise RuntimeError(f"Attempted {funcname} but _scale is None.  This may indicate "
                               f"your script did not use scaler.scale(loss or outputs) earlier "
                               f"in the iteration.")

    def _state(self, optimizer):
        return self._per_optimizer_states.setdefault(id(optimizer), _fresh_state())

    # ------------------------------------------------------------- unscaling
    def unscale_(self, optimizer):
        """Divide ``optimizer``'s gradients by the scale in place (e.g. before
        gradient clipping) and record whether any is inf/nan.  At most once per
        optimizer between ``update`` calls; ``step`` then does not unscale again."""
        if not self._enabled:
            return
        self._require_scale("unscale_")
        state = self._state(optimizer)
        if state["stage"] is OptState.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since "
                               "the last update().")
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = _f32(1.0 / self._scale)      # reciprocal in double, then float32 (torch)
        state["found_inf"] = _unscale_grads(optimizer, inv_scale)
        state["stage"] = OptState.UNSCALED

    # ------------------------------------------------------------- stepping
    def step(self, optimizer, *args, **kwargs):
        """``optimizer.step(*args, **kwargs)`` unless a gradient is inf/nan, in
        which case the step is skipped and None returned.  Unscales first if
        ``unscale_`` was not called for this optimizer in this iteration."""
        if not self._enabled:
            self._last_step_skipped = False
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is "
                               "enabled.")
        self._require_scale("step")
        state = self._state(optimizer)
        if state["stage"] is OptState.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is OptState.READY:
            self.unscale_(optimizer)
        retval = None
        skipped = state["found_inf"]
        if not skipped:
            retval = optimizer.step(*args, **kwargs)
        state["stage"] = OptState.STEPPED
        self._last_step_skipped = skipped
        return retval

    @property
    def last_step_skipped(self):
        """True if the last ``step`` skipped ``optimizer.step`` (inf/nan gradients),
        False if it stepped, None before the first ``step``.  Kept across
        ``update``, so it can be read after the iteration ends."""
        return self._last_step_skipped

    def update(self, new_scale=None):
        """Back off the scale if any optimizer's step was skipped since the last
        update, grow it after ``growth_interval`` clean steps; or set it to
        ``new_scale`` (a float, or a 1-element tensor without grad)."""
        if not self._enabled:
            return
        self._require_scale("update")
        if new_scale is not None:
            self._scale = self._new_scale_value(new_scale)
        else:
            found = [s["found_inf"] for s in self._per_optimizer_states.values()
                     if s["found_inf"] is not None]
            if not found:
                raise RuntimeError("No inf checks were recorded prior to update.")
            self._update_scale(any(found))
        self._per_optimizer_states = {}

    def _new_scale_value(self, new_scale):
        if isinstance(new_scale, Tensor):
            if new_scale.device.type != self._device or new_scale.numel() != 1 \
                    or new_scale.requires_grad:
                raise ValueError(f"GradScaler.update: new_scale should be a float or a "
                                 f"1-element {self._device} Tensor with requires_grad=False, "
                                 f"got shape {tuple(new_scale.shape)} on "
                                 f"{new_scale.device.type}, "
                                 f"requires_grad={new_scale.requires_grad}")
            return _f32(new_scale.item())
        if isinstance(new_scale, bool) or not isinstance(new_scale, (int, float)):
            raise TypeError(f"GradScaler.update: new_scale must be a float or a 1-element "
                            f"Tensor, got {type(new_scale).__name__}")
        return _f32(new_scale)

    def _update_scale(self, found_inf):
        """torch._amp_update_scale_, in float32."""
        scale = np.float32(self._scale)
        if found_inf:
            self._scale = float(scale * np.float32(self._backoff_factor))
            self._growth_tracker = 0
            return
        successful = self._growth_tracker + 1
        if successful == self._growth_interval:
            with np.errstate(over="ignore"):          # an overflow keeps the old scale
                grown = scale * np.float32(self._growth_factor)
            if np.isfinite(grown):
                self._scale = float(grown)
            successful = 0
        self._growth_tracker = successful

    # ------------------------------------------------------------- getters/setters
    def get_scale(self):
        """The current scale as a Python float (1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else self._scale

    def get_growth_factor(self):
        return self._growth_factor

    def set_growth_factor(self, new_factor):
        _check_growth_factor(new_factor)
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self):
        return self._backoff_factor

    def set_backoff_factor(self, new_factor):
        _check_backoff_factor(new_factor)
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self):
        return self._growth_interval

    def set_growth_interval(self, new_interval):
        _check_growth_interval(new_interval)
        self._growth_interval = int(new_interval)

    def _get_growth_tracker(self):
        return self._growth_tracker if self._enabled else 0

    def is_enabled(self):
        return self._enabled

    # ------------------------------------------------------------- state dict
    _STATE_KEYS = ("scale", "growth_factor", "backoff_factor", "growth_interval",
                   "_growth_tracker")

    def state_dict(self):
        """torch's five entries (plain Python numbers); empty when disabled.
        Call it after ``update`` to checkpoint an iteration."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict):
        """Restore ``state_dict()``'s values (a no-op when disabled)."""
        if not self._enabled:
            return
        if not isinstance(state_dict, dict):
            raise TypeError(f"GradScaler.load_state_dict: state_dict must be a dict, got "
                            f"{type(state_dict).__name__}")
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        missing = [k for k in self._STATE_KEYS if k not in state_dict]
        if missing:
            raise ValueError(f"GradScaler.load_state_dict: state_dict is missing {missing}")
        self._init_scale = float(state_dict["scale"])
        if self._scale is not None:
            self._scale = _f32(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])


# ----------------------------------------------------------------- the unscale pass
def _unscale_grads(optimizer, inv_scale):
    """Unscale every gradient of ``optimizer`` in place; True if any had inf/nan.

    One ``amp_unscale_check`` call per device type over all its gradients;
    bfloat16 ones (uint16 words) go in as float32 copies that are cast back."""
    per_device = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            g = p.grad
            if g is None:
                continue
            if g.dtype is _dt.float16:       # torch: fp16 grads mean fp16 master weights
                raise ValueError("Attempting to unscale FP16 gradients.")
            per_device.setdefault(g.device.type, []).append(g)
    found = False
    for dev, grads in per_device.items():
        arrays, bf16 = [], []
        for g in grads:
            if g.dtype.storage is g.dtype.compute:
                arrays.append(g._data)
            else:
                values = g._compute()        # a new float32 array (the cast's output)
                bf16.append((g, values))
                arrays.append(values)
        if kernel("amp_unscale_check", dev)(arrays, inv_scale):
            found = True
        for g, values in bf16:
            g._data[...] = kernel("cast", dev)(values, _dt.float32, g.dtype)
        for g in grads:
            g._version[0] += 1
    return found
