"""nn.functional (``import pyflow.nn.functional as F``): PyTorch's functional API.

Every function is the op of the same name in ``pyflow.ops`` (where the
Function, its backward and the kernel live).  Only the arguments that exist in
``F`` but not in the ``pyflow.*`` op (``inplace=``, softmax's implicit ``dim``)
are handled here.
"""
import warnings

__all__ = ["linear", "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d",
           "relu", "relu_", "gelu", "silu", "sigmoid", "tanh", "softmax", "log_softmax",
           "layer_norm", "batch_norm", "dropout", "embedding", "cross_entropy", "nll_loss",
           "mse_loss", "l1_loss", "binary_cross_entropy_with_logits",
           "scaled_dot_product_attention", "pad", "one_hot",
           "rms_norm", "group_norm", "fused_add_layer_norm", "fused_bias_add_gelu",
           "fused_bias_dropout_add",
           "fused_scale_mask_softmax", "fused_batch_norm_add_relu",
           "fused_scale_mask_softmax_dropout"]

from .. import ops as _ops
from ..ops._util import check_tensor as _check_tensor


def _forward(name, doc):
    """``F.name``: the op ``pyflow.ops.name`` itself, documented with F's signature."""
    fn = getattr(_ops, name)
    fn.__doc__ = fn.__doc__ or doc
    return fn


# ------------------------------------------------------------------ linear / conv / pooling
linear = _forward("linear", "linear(input, weight, bias=None): y = x W^T + b.")
conv2d = _forward("conv2d", "conv2d(input, weight, bias=None, stride=1, padding=0, "
                            "dilation=1, groups=1).")
max_pool2d = _forward("max_pool2d", "max_pool2d(input, kernel_size, stride=None, padding=0, "
                                    "dilation=1, ceil_mode=False, return_indices=False).")
avg_pool2d = _forward("avg_pool2d", "avg_pool2d(input, kernel_size, stride=None, padding=0, "
                                    "ceil_mode=False, count_include_pad=True, "
                                    "divisor_override=None).")
adaptive_avg_pool2d = _forward("adaptive_avg_pool2d", "adaptive_avg_pool2d(input, output_size).")


# ------------------------------------------------------------------ activations
def relu(input, inplace=False):
    """max(x, 0); ``inplace=True`` overwrites ``input``."""
    return relu_(input) if inplace else _ops.relu(input)


def relu_(input):
    return _check_tensor(input, "input", "relu_").relu_()


def gelu(input, approximate="none"):
    """x * Phi(x); ``approximate='tanh'`` uses the tanh approximation."""
    return _ops.gelu(input, approximate=approximate)


def silu(input, inplace=False):
    """x * sigmoid(x)."""
    out = _ops.silu(_check_tensor(input, "input", "silu"))
    if inplace:
        from ..autograd import no_grad
        with no_grad():
            input.copy_(out)
        return input
    return out


def sigmoid(input):
    return _ops.sigmoid(input)


def tanh(input):
    return _ops.tanh(input)


def _get_softmax_dim(name, ndim):
    warnings.warn(f"Implicit dimension choice for {name} has been deprecated. Change the call "
                  f"to include dim=X as an argument.", stacklevel=3)
    return 0 if ndim in (0, 1, 3) else 1


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """exp(x) / sum(exp(x)) along ``dim``; ``dtype`` casts the input first."""
    if dim is None:
        dim = _get_softmax_dim("softmax", _check_tensor(input, "input", "softmax").dim())
    if dtype is not None:
        input = input.to(dtype)
    return _ops.softmax(input, dim)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """log(softmax(x)) along ``dim``, computed stably."""
    if dim is None:
        dim = _get_softmax_dim("log_softmax", _check_tensor(input, "input", "log_softmax").dim())
    if dtype is not None:
        input = input.to(dtype)
    return _ops.log_softmax(input, dim)


# ------------------------------------------------------------------ normalization / dropout
layer_norm = _forward("layer_norm", "layer_norm(input, normalized_shape, weight=None, "
                                    "bias=None, eps=1e-05).")
batch_norm = _forward("batch_norm", "batch_norm(input, running_mean, running_var, weight=None, "
                                    "bias=None, training=False, momentum=0.1, eps=1e-05); "
                                    "updates the running stats in place when training.")
rms_norm = _forward("rms_norm", "rms_norm(input, normalized_shape, weight=None, eps=None).")
group_norm = _forward("group_norm", "group_norm(input, num_groups, weight=None, bias=None, "
                                    "eps=1e-05).")
dropout = _forward("dropout", "dropout(input, p=0.5, training=True, inplace=False).")
embedding = _forward("embedding", "embedding(input, weight, padding_idx=None, max_norm=None, "
                                  "norm_type=2.0, scale_grad_by_freq=False, sparse=False).")

# ------------------------------------------------------------------ losses
cross_entropy = _forward("cross_entropy", "cross_entropy(input, target, weight=None, "
                                          "size_average=None, ignore_index=-100, reduce=None, "
                                          "reduction='mean', label_smoothing=0.0).")
nll_loss = _forward("nll_loss", "nll_loss(input, target, weight=None, size_average=None, "
                                "ignore_index=-100, reduce=None, reduction='mean').")
mse_loss = _forward("mse_loss", "mse_loss(input, target, size_average=None, reduce=None, "
                                "reduction='mean').")
l1_loss = _forward("l1_loss", "l1_loss(input, target, size_average=None, reduce=None, "
                              "reduction='mean').")
binary_cross_entropy_with_logits = _forward(
    "binary_cross_entropy_with_logits",
    "binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, "
    "reduce=None, reduction='mean', pos_weight=None).")

# ------------------------------------------------------------------ attention / misc
scaled_dot_product_attention = _forward(
    "scaled_dot_product_attention",
    "scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, "
    "is_causal=False, scale=None, enable_gqa=False).")
pad = _forward("pad", "pad(input, pad, mode='constant', value=None).")
one_hot = _forward("one_hot", "one_hot(tensor, num_classes=-1).")


def __getattr__(name):
    """Any other ``F.name`` that pyflow.ops has."""
    if not name.startswith("__") and hasattr(_ops, name):
        return getattr(_ops, name)
    raise AttributeError(f"module 'pyflow.nn.functional' has no attribute '{name}'")


# ------------------------------------------------------------------ fused ops
# (pyflow's own, as OneFlow's flow._C.fused_*: one kernel pass for what PyTorch
# code writes as several ops; each equals its unfused composition)
from ..ops.fused import fused_bias_add_gelu, fused_bias_dropout_add  # noqa: E402
from ..ops.normalization import fused_add_layer_norm, fused_batch_norm_add_relu  # noqa: E402
from ..ops.softmax import fused_scale_mask_softmax, fused_scale_mask_softmax_dropout  # noqa: E402,E501
