"""nn.Parameter: a leaf tensor that a Module registers as a parameter."""
from ..tensor import TENSOR_TYPES, Tensor


class Parameter(Tensor):
    __slots__ = ()

    def __new__(cls, data=None, requires_grad=True):
        if data is None:
            from ..ops.creation import empty
            data = empty(0)
        if not isinstance(data, Tensor):
            raise TypeError(f"Parameter: data must be a Tensor, got {type(data).__name__}")
        if requires_grad and not data.dtype.is_floating_point:
            # as PyTorch: a trainable integer parameter would silently never train
            raise RuntimeError(f"Parameter: only Tensors of floating point dtype can require "
                               f"gradients, got {data.dtype} (pass requires_grad=False for a "
                               f"parameter that is not trained)")
        p = Tensor._make(data._data, data.dtype, data.device)
        p.__class__ = cls
        p._version = data._version  # shares storage with data
        p.requires_grad = bool(requires_grad)
        if data._placement is not None:     # a global parameter (data or tensor parallel)
            p._placement, p._sbp, p._logical_shape = \
                data._placement, data._sbp, data._logical_shape
        return p

    def __init__(self, data=None, requires_grad=True):
        pass

    def __repr__(self):
        return "Parameter containing:\n" + super().__repr__()

    # Tensor binds __str__ to its own __repr__; print(param) must show the header too.
    __str__ = __repr__

    def __deepcopy__(self, memo):
        """copy.deepcopy(model): a new Parameter with a copy of the data (and grad)."""
        if id(self) in memo:
            return memo[id(self)]
        from ..ops.shape import clone
        from ..autograd import no_grad
        with no_grad():
            p = Parameter(clone(self.detach()), self.requires_grad)
            if self.grad is not None:
                p.grad = clone(self.grad.detach())
        memo[id(self)] = p
        return p

    def __reduce_ex__(self, proto):
        from ..ops.creation import tensor
        return (Parameter, (tensor(self.detach()._compute(), dtype=self.dtype), self.requires_grad))


TENSOR_TYPES.add(Parameter)
