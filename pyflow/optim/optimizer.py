"""Optimizer base class: param groups, state, state_dict, zero_grad.

Same layout and behaviour as ``torch.optim.Optimizer``: ``param_groups`` is a
list of dicts (``params`` plus per-group options filled from ``defaults``);
``state`` maps each parameter tensor to a dict of its buffers.  A state dict
replaces tensors by their index in group order, so it can be saved and loaded
into a freshly built optimizer over the same model.

Subclasses implement ``step``; they update ``p._data`` in place through a
fused kernel (``kernels/cpu/optim.py``) and bump ``p._version`` so autograd
notices the parameter changed.
"""
import warnings
from collections import defaultdict
from copy import deepcopy
from itertools import chain

from .. import dtypes as _dt
from ..autograd import enable_grad
from ..ops._util import array_module, kernel
from ..tensor import Tensor

__all__ = ["Optimizer", "required"]


class _RequiredParameter:
    """Marks a default that every param group must give (like torch's ``required``)."""

    def __repr__(self):
        return "<required parameter>"


required = _RequiredParameter()


class Optimizer:
    def __init__(self, params, defaults):
        self.defaults = defaults
        if isinstance(params, Tensor):
            raise TypeError("params argument given to the optimizer should be an iterable of "
                            f"Tensors or dicts, but got {params.type()}")
        if isinstance(params, set):  # torch accepts it here, but state_dict order would vary
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        self.state = defaultdict(dict)
        self.param_groups = []
        param_groups = list(params)
        if len(param_groups) == 0:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(param_groups[0], dict):
            param_groups = [{"params": param_groups}]
        for group in param_groups:
            self.add_param_group(group)

    # ------------------------------------------------------------- groups
    def add_param_group(self, param_group):
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, but got {type(param_group).__name__}")
        if "params" not in param_group:
            raise KeyError("param_group must have a 'params' entry")
        params = param_group["params"]
        if isinstance(params, Tensor):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered collections, "
                            "but the ordering of tensors in sets will change between runs. "
                            "Please use a list instead.")
        else:
            params = list(params)
        # (name, tensor) pairs, as from module.named_parameters()
        names = [p[0] for p in params if isinstance(p, tuple)]
        tensors = [p[1] if isinstance(p, tuple) else p for p in params]
        if names and len(names) != len(tensors):
            raise ValueError("all optimizer params should be with/without names. "
                             "Some param names are missing")
        param_group["params"] = tensors
        if names:
            param_group["param_names"] = names
        for p in tensors:
            if not isinstance(p, Tensor):
                raise TypeError("optimizer can only optimize Tensors, but one of the params is "
                                f"{type(p).__module__}.{type(p).__name__}")
            if not p.is_leaf:
                raise ValueError("can't optimize a non-leaf Tensor")
        for name, default in self.defaults.items():
            if default is required and name not in param_group:
                raise ValueError(f"parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            param_group.setdefault(name, default)
        self._check_group(param_group)
        ids = [id(p) for p in tensors]
        if len(ids) != len(set(ids)):
            warnings.warn("optimizer contains a parameter group with duplicate parameters; "
                          "in future, this will cause an error", stacklevel=3)
        seen = set()
        for group in self.param_groups:
            seen.update(id(p) for p in group["params"])
            if ("param_names" in param_group) != ("param_names" in group):
                which = "with names" if "param_names" in param_group else "without names"
                raise ValueError("all optimizer param groups should be with/without names. "
                                 f"cannot add param group {which} to the optimizer")
        if not seen.isdisjoint(ids):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(param_group)

    def _check_group(self, group):
        """Validate one group's options (subclasses: torch's constructor checks)."""

    # ------------------------------------------------------------- stepping
    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if set_to_none:
                    p.grad = None
                    continue
                if g.grad_fn is not None:
                    g.detach_()
                else:
                    g.requires_grad = False
                g._data[...] = 0
                g._version[0] += 1

    def step(self, closure=None):
        raise NotImplementedError(f"{type(self).__name__} must implement step(closure=None)")

    def _update_all(self):
        """Step every parameter that has a gradient, in multi-tensor kernels
        (``_update_params``), one per compute dtype and device.  Each kernel
        runs the single-parameter arithmetic per tensor, so this equals a loop
        of ``_update_param`` bit for bit, with one Python pass and one kernel
        call for the lot (a small GPT's 28 Adam updates: 650 -> 280 us)."""
        pairs = [(g, p) for g in self.param_groups for p in g["params"] if p.grad is not None]
        for batch in same_kind_batches(pairs):
            self._update_params(batch)

    @staticmethod
    def _run_closure(closure):
        if closure is None:
            return None
        with enable_grad():
            return closure()

    # ------------------------------------------------------------- state dict
    def state_dict(self):
        index_of = {}
        start = 0

        def pack_group(group):
            nonlocal start
            packed = {k: v for k, v in group.items() if k != "params"}
            for i, p in enumerate(group["params"], start):
                index_of.setdefault(id(p), i)
            packed["params"] = [index_of[id(p)] for p in group["params"]]
            start += len(packed["params"])
            return packed

        param_groups = [pack_group(g) for g in self.param_groups]
        state = {(index_of[id(k)] if isinstance(k, Tensor) else k): v
                 for k, v in self.state.items()}
        return {"state": state, "param_groups": param_groups}

    def load_state_dict(self, state_dict):
        if not isinstance(state_dict, dict) or "param_groups" not in state_dict \
                or "state" not in state_dict:
            raise ValueError("load_state_dict: expected a dict with 'state' and 'param_groups' "
                             "(as returned by Optimizer.state_dict())")
        groups = self.param_groups
        saved_groups = deepcopy(state_dict["param_groups"])
        if len(groups) != len(saved_groups):
            raise ValueError(f"loaded state dict has a different number of parameter groups "
                             f"({len(saved_groups)}) than the optimizer ({len(groups)})")
        for i, (g, s) in enumerate(zip(groups, saved_groups)):
            if len(g["params"]) != len(s["params"]):
                raise ValueError(
                    f"loaded state dict contains a parameter group that doesn't match the size "
                    f"of optimizer's group: group {i} has {len(s['params'])} params in the "
                    f"state dict and {len(g['params'])} in the optimizer")
        id_map = dict(zip(chain.from_iterable(g["params"] for g in saved_groups),
                          chain.from_iterable(g["params"] for g in groups)))
        state = defaultdict(dict)
        for k, v in state_dict["state"].items():
            if k in id_map:
                p = id_map[k]
                self._check_state_shapes(k, p, v)
                state[p] = self._cast_state(p, v)
            else:
                state[k] = v
        for g, s in zip(groups, saved_groups):
            s["params"] = g["params"]
            if "param_names" in g and "param_names" not in s:
                s["param_names"] = g["param_names"]
            for name, default in self.defaults.items():  # options added since the save
                s.setdefault(name, default)
        self.state = state
        self.param_groups = saved_groups

    # State buffers that have the shape of their parameter (checked on load, so a
    # checkpoint of another model fails here rather than in the first step).
    _PARAM_SHAPED_STATE = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")

    def _check_state_shapes(self, index, param, value):
        if not isinstance(value, dict):
            return
        for key in self._PARAM_SHAPED_STATE:
            t = value.get(key)
            if isinstance(t, Tensor) and tuple(t.shape) != tuple(param.shape):
                raise ValueError(f"loaded state dict has '{key}' of shape {tuple(t.shape)} for "
                                 f"parameter {index}, but that parameter has shape "
                                 f"{tuple(param.shape)}")

    @classmethod
    def _cast_state(cls, param, value, key=None):
        """A copy of a loaded state value in the dtype the step kernels use."""
        if isinstance(value, Tensor):
            if key == "step" or not value.dtype.is_floating_point:
                return value.to(copy=True)
            if key in cls._PARAM_SHAPED_STATE and param._placement is not None \
                    and value._placement is None:
                # a whole (local) state tensor for a global parameter: its layout
                from ..distributed.global_tensor import distribute_like
                value = distribute_like(value, param)
            out = value.to(_state_dtype(param), copy=True)
            if not out._data.flags.c_contiguous:
                out._data = array_module(out._data).ascontiguousarray(out._data)
            return out
        if isinstance(value, dict):
            return {k: cls._cast_state(param, v, k) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(cls._cast_state(param, v) for v in value)
        return value

    def __getstate__(self):
        return self.__dict__

    def __setstate__(self, state):
        self.__dict__.update(state)

    def __repr__(self):
        lines = [type(self).__name__ + " ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for key in sorted(group):
                if key != "params":
                    lines.append(f"    {key}: {group[key]}")
        lines.append(")")
        return "\n".join(lines)


# ----------------------------------------------------------------- helpers for step()
def next_step(step_t):
    """Add one to a 0-dim step-count tensor in place; returns the new count.
    (Through a Python float and ``fill``: numpy's in-place add on a 0-dim
    array costs ~1.5 us, a tenth of a small parameter's whole update.  The
    sum is exact, so float32 rounds it as an in-place float32 add would.)"""
    count = float(step_t._data) + 1
    step_t._data.fill(count)
    step_t._version[0] += 1
    return float(step_t._data)


def update_key(p):
    """What parameters of one multi-tensor update share: compute dtype and device."""
    return (p.dtype.compute, str(p.device))


def same_kind_batches(pairs):
    """``(group, param)`` pairs split by ``update_key``, in first-seen order."""
    out = {}
    for g, p in pairs:
        out.setdefault(update_key(p), []).append((g, p))
    return list(out.values())


def scalar_value(x):
    """A hyperparameter as a Python number (torch also allows a 1-element tensor lr)."""
    return x.item() if isinstance(x, Tensor) else x


def _state_dtype(param):
    """Optimizer buffers of float16/bfloat16 params are kept in float32: the
    kernels compute in float32 anyway, and rounding the moments to 16 bits
    every step would lose small updates."""
    d = param.dtype
    return d if d.storage is d.compute and d.is_floating_point else _dt.float32


def zeros_state(param):
    """Zeros shaped like ``param``'s data (for a global parameter: its piece, and
    the state is global with the parameter's placement and SBP)."""
    from ..ops.creation import zeros
    state = zeros(tuple(param._data.shape), dtype=_state_dtype(param), device=param.device)
    if param._placement is not None:
        state._placement, state._sbp, state._logical_shape = \
            param._placement, param._sbp, param._logical_shape
    return state


class FlatParam:
    """A parameter's data as a flat contiguous array in its compute dtype.

    float32/float64 contiguous params are updated in place with no copy; other
    layouts and half types work on a copy that ``write_back`` stores."""
    __slots__ = ("param", "array", "copied")

    def __init__(self, param):
        self.param = param
        d, data = param.dtype, param._data
        if not d.is_floating_point:
            raise TypeError(f"optimizer: can only update floating point parameters, "
                            f"got one of dtype {d}")
        self.copied = not (d.storage is d.compute and data.flags.c_contiguous
                           and data.flags.writeable)
        if self.copied:
            values = param._compute()
            self.array = array_module(values).ascontiguousarray(values, dtype=d.compute).reshape(-1)
        else:
            self.array = data.reshape(-1)

    def write_back(self):
        p = self.param
        if self.copied:
            values = self.array.reshape(p._data.shape)
            if p.dtype.storage is not p.dtype.compute:
                values = kernel("cast", p.device.type)(values, _state_dtype(p), p.dtype)
            p._data[...] = values
        p._version[0] += 1


def flat_grad(param):
    """The gradient as a flat contiguous array in the param's compute dtype."""
    g = param.grad
    a, d = g._data, param._data
    if (a.dtype == d.dtype and a.shape == d.shape and a.flags.c_contiguous
            and g._logical_shape == param._logical_shape
            and param.dtype.storage is param.dtype.compute):
        return a.reshape(-1)        # the common case, as the general path below would give it
    if tuple(g.shape) != tuple(param.shape):
        raise RuntimeError(f"optimizer: grad of shape {tuple(g.shape)} does not match its "
                           f"parameter of shape {tuple(param.shape)}")
    arr = g._compute()
    compute = _state_dtype(param).compute
    return array_module(arr).ascontiguousarray(arr, dtype=compute).reshape(-1)


def flat_state(state, key):
    """A state buffer as a flat array the kernel may write (it is contiguous:
    created so by ``zeros_state`` or made so by ``_cast_state``)."""
    t = state[key]
    if not t._data.flags.c_contiguous:
        t._data = array_module(t._data).ascontiguousarray(t._data)
    return t._data.reshape(-1)
