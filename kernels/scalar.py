"""Scalar definitions of every elementwise op: one plain Python function each.

These are the single source of truth for elementwise math.  The CPU backend
turns each into a NumPy ufunc with ``numba.vectorize`` (broadcasting and
strides come from NumPy's ufunc machinery); the CUDA backend compiles the very
same functions as ``@cuda.jit(device=True)`` helpers; the graph compiler's
fusion pass inlines chains of them into one generated kernel.

Each entry of ``UNARY``/``BINARY``/``TERNARY`` maps an op name to
``(function, kind)``: kind ``"arith"`` computes in the input dtype (floats and
ints), ``"float"`` needs a floating dtype, ``"compare"``/``"logical"`` return bool.

Each function is self-contained (arithmetic and ``math`` only, no calls to its
neighbours), so every backend can compile it on its own.

``INTEGER`` holds the few ops whose integer kernels need their own definition
(PyTorch's integer ``pow`` and ``//``); both backends use it for int dtypes.

Zeros are written as the literal ``0``, never as ``x * 0``: ``inf * 0`` is NaN,
so ``relu(-inf)`` or an infinite gradient through relu's backward would become
NaN (PyTorch gives 0).  The float32 clones turn the literal into a float32 zero.
"""
import math

SQRT1_2 = 0.7071067811865476
SQRT_2_OVER_PI = 0.7978845608028654
INV_SQRT_2PI = 0.3989422804014327


# ---- binary
def add(a, b): return a + b
def sub(a, b): return a - b
def mul(a, b): return a * b
def div(a, b): return a / b
def pow_(a, b): return a ** b
def maximum(a, b): return a if (a > b or a != a) else b       # NaN propagates
def minimum(a, b): return a if (a < b or a != a) else b
def eq(a, b): return a == b
def ne(a, b): return a != b
def lt(a, b): return a < b
def le(a, b): return a <= b
def gt(a, b): return a > b
def ge(a, b): return a >= b
def floor_divide(a, b): return a // b
def remainder(a, b): return a % b
def logical_and(a, b): return bool(a) and bool(b)
def logical_or(a, b): return bool(a) or bool(b)
def logical_xor(a, b): return bool(a) != bool(b)


# ---- unary
def neg(x): return -x
def exp(x): return math.exp(x)
def log(x): return math.log(x) if x > 0 else (-math.inf if x == 0 else math.nan)
def sqrt(x): return math.sqrt(x) if x >= 0 else math.nan
def rsqrt(x):   # 1 / sqrt(-0.0) is -inf, as in PyTorch
    return 1.0 / math.sqrt(x) if x > 0 else (math.copysign(math.inf, x) if x == 0 else math.nan)
def abs_(x): return -x if x < 0 else (x if x != 0 else 0)      # abs(-0.0) = +0.0
def sign(x): return int(x > 0) - int(x < 0)                   # sign(NaN) = 0, as in PyTorch
def sin(x): return math.sin(x)
def cos(x): return math.cos(x)
def tanh(x): return math.tanh(x)
def sigmoid(x): return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
def relu(x): return 0 if x < 0 else x                         # NaN and -0.0 pass, as in PyTorch
def gelu(x): return 0.5 * x * (1.0 + math.erf(x * SQRT1_2))
def gelu_tanh(x): return 0.5 * x * (1.0 + math.tanh(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
def silu(x): return x / (1.0 + math.exp(-x)) if x >= -30.0 else x * math.exp(x)
def logical_not(x): return not x
def reciprocal(x): return 1.0 / x


# ---- fused backward helpers: grad of the input from (incoming grad, saved value)
def relu_backward(g, y): return 0 if y <= 0 else g              # PyTorch's threshold_backward
def sigmoid_backward(g, y): return g * y * (1.0 - y)
def tanh_backward(g, y): return g * (1.0 - y * y)
def gelu_backward(g, x):
    return g * (0.5 * (1.0 + math.erf(x * SQRT1_2)) + x * INV_SQRT_2PI * math.exp(-0.5 * x * x))
def gelu_tanh_backward(g, x):
    inner = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)
    t = math.tanh(inner)
    return g * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * x * x))
def silu_backward(g, x):
    s = 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))
    return g * s * (1.0 + x * (1.0 - s))


# ---- integer versions (PyTorch's integer semantics where numba's differ)
def int_pow(a, b):
    # a ** -n is 1 / a ** n truncated: 0 unless a is 1 or -1 (numba's a ** b gives
    # INT64_MIN for 0 ** -1).  The op refuses a negative number exponent before this.
    if b >= 0:
        return a ** b
    if a == 1:
        return 1
    if a == -1:
        return -1 if b % 2 else 1
    return 0


def int_floor_divide(a, b):
    # INT_MIN // -1 overflows: PyTorch wraps it to INT_MIN (= -INT_MIN), numba gives 0.
    # Division by zero never gets here: the op raises first.
    return -a if b == -1 else a // b


# ---- ternary
def where(c, a, b): return a if c else b
def clamp(x, lo, hi): return lo if x < lo else (hi if x > hi else x)


BINARY = {
    "add": (add, "arith"), "sub": (sub, "arith"), "mul": (mul, "arith"), "div": (div, "float"),
    "pow": (pow_, "arith"), "maximum": (maximum, "arith"), "minimum": (minimum, "arith"),
    "eq": (eq, "compare"), "ne": (ne, "compare"), "lt": (lt, "compare"), "le": (le, "compare"),
    "gt": (gt, "compare"), "ge": (ge, "compare"),
    "floor_divide": (floor_divide, "arith"), "remainder": (remainder, "arith"),
    "logical_and": (logical_and, "logical"), "logical_or": (logical_or, "logical"),
    "logical_xor": (logical_xor, "logical"),
    "relu_backward": (relu_backward, "float"), "sigmoid_backward": (sigmoid_backward, "float"),
    "tanh_backward": (tanh_backward, "float"), "gelu_backward": (gelu_backward, "float"),
    "gelu_tanh_backward": (gelu_tanh_backward, "float"), "silu_backward": (silu_backward, "float"),
}
UNARY = {
    "neg": (neg, "arith"), "abs": (abs_, "arith"), "sign": (sign, "arith"),
    "exp": (exp, "float"), "log": (log, "float"), "sqrt": (sqrt, "float"), "rsqrt": (rsqrt, "float"),
    "sin": (sin, "float"), "cos": (cos, "float"), "tanh": (tanh, "float"),
    "sigmoid": (sigmoid, "float"), "relu": (relu, "arith"), "gelu": (gelu, "float"),
    "gelu_tanh": (gelu_tanh, "float"), "silu": (silu, "float"), "reciprocal": (reciprocal, "float"),
    "logical_not": (logical_not, "logical"),
}
TERNARY = {"where": (where, "select"), "clamp": (clamp, "arith")}
INTEGER = {"pow": int_pow, "floor_divide": int_floor_divide}
