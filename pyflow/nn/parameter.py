"""nn.Parameter: a leaf tensor that a Module registers as a parameter."""
from ..tensor import Tensor


class Parameter(Tensor):
    __slots__ = ()

    def __new__(cls, data=None, requires_grad=True):
        if data is None:
            from ..ops.creation import empty
            data = empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter: data must be a Tensor, got {type(data).__name__}")
        p = Tensor._make(data._data, data.dtype, data.device)
        p.__class__ = cls
        p._version = data._version  # shares storage with data
        p.requires_grad = requires_grad and data.dtype.is_floating_point
        return p

    def __init__(self, data=None, requires_grad=True):
        pass

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    def __reduce_ex__(self, proto):
        from ..ops.creation import tensor
        return (Parameter, (tensor(self.detach()._compute(), dtype=self.dtype), self.requires_grad))
