"""Fused elementwise CPU kernels: one generated numba ufunc per expression.

The graph compiler's fusion pass (``pyflow/graph/passes/fusion.py``) turns a
chain of elementwise ops into one *expression* and calls
``kernel("fused_elementwise", device)(expr, *operands)``.  An expression is a
plain hashable tuple ``(program, scalars, wrt)`` (the compile-cache key):

* ``program``: instructions ``(op name, refs)`` in order; ``refs`` index the
  operands (``ref < nargs``) or earlier results (``nargs + j`` is instruction
  ``j``'s result); the last instruction's result is the value;
* ``scalars``: one bool per operand, True where it is a number (passed at
  call time, so a graph's constants do not each compile a kernel);
* ``wrt``: ``None`` for the value itself; ``k`` for the gradient kernel of
  operand ``k``: its operands are ``(g, *operands)`` and it returns
  ``g * d value / d operand k`` elementwise, before any broadcast reduction.

``scalar_source(expr)`` writes one scalar Python function: the forward
program as calls of the scalar definitions in ``kernels/scalar.py``, then (for
a gradient) reverse-mode accumulation of adjoints through the instructions
that depend on operand ``wrt``, with each op's derivative rule below.  Both
backends compile that same source: here with ``numba.vectorize`` (NumPy's
ufunc machinery gives broadcasting, strides and 0-d operands), in
``kernels/cuda/fused.py`` as a ``cuda.jit(device=True)`` function.

float32 uses the float32 clones of the scalar functions (float32 constants,
and the vectorizable ``fast_exp``/``fast_erf`` of ``fastmath.py``) and
``fastmath`` flags without nnan/ninf, as ``activation.py`` does: Python float
literals would otherwise make numba compute float32 data in float64.  The
generated source has no literals of its own: constants are typed globals
(``ONE``, ``HALF``, ...).  Kernels compile on first use per (expr, dtype), in
memory only (generated source has no file for numba's disk cache).
"""
import types as _pytypes

import numpy as np
from numba import njit, prange, vectorize

from .. import scalar
from ..registry import register
from .activation import FASTMATH, float32_version

# The ops a program may use, by name (their scalar definitions), and the scalar
# helpers the derivative rules call.
FORWARD_OPS = ("add", "sub", "mul", "div", "pow", "maximum", "minimum", "neg", "exp", "log",
               "sqrt", "rsqrt", "abs", "sin", "cos", "tanh", "sigmoid", "relu", "gelu",
               "gelu_tanh", "silu", "reciprocal")
_HELPERS = ("sign", "tanh_backward", "sigmoid_backward", "relu_backward", "gelu_backward",
            "gelu_tanh_backward", "silu_backward")
SCALAR_FUNCTIONS = {name: (scalar.UNARY.get(name) or scalar.BINARY[name])[0]
                    for name in FORWARD_OPS + _HELPERS}
CONSTANTS = {"ZERO": 0.0, "HALF": 0.5, "ONE": 1.0, "TWO": 2.0, "NEG_HALF": -0.5}
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# d value / d operand for each op: rule(g, operands, y) -> one source string per
# operand (None: no gradient).  g is the adjoint of the op's result y.  They follow
# the eager backward rules of pyflow/ops/elementwise.py term for term.
RULES = {
    "add": lambda g, a, y: (g, g),
    "sub": lambda g, a, y: (g, f"-{g}"),
    "mul": lambda g, a, y: (f"{g} * {a[1]}", f"{g} * {a[0]}"),
    "div": lambda g, a, y: (f"{g} / {a[1]}", f"-({g} * {a[0]} / ({a[1]} * {a[1]}))"),
    "pow": lambda g, a, y: (f"{g} * {a[1]} * f_pow({a[0]}, {a[1]} - ONE)", None),
    # as eager maximum/minimum (PyTorch's rule): ties split the gradient, the operand
    # not picked gets ZERO (selected, never g * 0: an infinite g would give NaN)
    "maximum": lambda g, a, y: (
        f"ZERO if {a[0]} < {a[1]} else ({g} * HALF if {a[0]} == {a[1]} else {g})",
        f"ZERO if {a[0]} > {a[1]} else ({g} * HALF if {a[0]} == {a[1]} else {g})"),
    "minimum": lambda g, a, y: (
        f"ZERO if {a[0]} > {a[1]} else ({g} * HALF if {a[0]} == {a[1]} else {g})",
        f"ZERO if {a[0]} < {a[1]} else ({g} * HALF if {a[0]} == {a[1]} else {g})"),
    "neg": lambda g, a, y: (f"-{g}",),
    "exp": lambda g, a, y: (f"{g} * {y}",),
    "log": lambda g, a, y: (f"{g} / {a[0]}",),
    "sqrt": lambda g, a, y: (f"{g} / ({y} * TWO)",),
    "rsqrt": lambda g, a, y: (f"{g} * NEG_HALF * ({y} * ({y} * {y}))",),
    "abs": lambda g, a, y: (f"{g} * f_sign({a[0]})",),
    "sin": lambda g, a, y: (f"{g} * f_cos({a[0]})",),
    "cos": lambda g, a, y: (f"-({g} * f_sin({a[0]}))",),
    "tanh": lambda g, a, y: (f"f_tanh_backward({g}, {y})",),
    "sigmoid": lambda g, a, y: (f"f_sigmoid_backward({g}, {y})",),
    "relu": lambda g, a, y: (f"f_relu_backward({g}, {y})",),
    "gelu": lambda g, a, y: (f"f_gelu_backward({g}, {a[0]})",),
    "gelu_tanh": lambda g, a, y: (f"f_gelu_tanh_backward({g}, {a[0]})",),
    "silu": lambda g, a, y: (f"f_silu_backward({g}, {a[0]})",),
    "reciprocal": lambda g, a, y: (f"-({g} * ({y} * {y}))",),
}


def check_expr(expr):
    """Refuse a malformed expression with a clear message (before numba sees it)."""
    try:
        program, scalars, wrt = expr
    except (TypeError, ValueError):
        raise TypeError(f"fused_elementwise: expr must be (program, scalars, wrt), "
                        f"got {expr!r}") from None
    nargs = len(scalars)
    if not program:
        raise ValueError("fused_elementwise: the program is empty")
    for j, (op, refs) in enumerate(program):
        if op not in RULES:
            raise ValueError(f"fused_elementwise: unknown op {op!r} at instruction {j}; "
                             f"known: {sorted(RULES)}")
        want = SCALAR_FUNCTIONS[op].__code__.co_argcount
        if len(refs) != want:
            raise ValueError(f"fused_elementwise: {op} takes {want} operand(s), "
                             f"instruction {j} gives {len(refs)}")
        if any(not 0 <= r < nargs + j for r in refs):
            raise ValueError(f"fused_elementwise: instruction {j} ({op}) refers to {refs}; "
                             f"only operands 0..{nargs - 1} and earlier results exist")
    if wrt is not None and not (0 <= wrt < nargs and not scalars[wrt]):
        raise ValueError(f"fused_elementwise: wrt={wrt} is not a tensor operand")
    return program, scalars, wrt


def scalar_source(expr, name="fused"):
    """Python source of the scalar function of ``expr`` (see the module docstring)."""
    program, scalars, wrt = check_expr(expr)
    nargs = len(scalars)

    def ref(r):
        return f"a{r}" if r < nargs else f"t{r - nargs}"

    params = ([] if wrt is None else ["g"]) + [f"a{i}" for i in range(nargs)]
    lines = [f"def {name}({', '.join(params)}):"]
    for j, (op, refs) in enumerate(program):
        lines.append(f"    t{j} = f_{op}({', '.join(ref(r) for r in refs)})")
    last = nargs + len(program) - 1
    if wrt is None:
        lines.append(f"    return {ref(last)}")
        return "\n".join(lines) + "\n"
    # reverse mode, only through results that depend on operand ``wrt``
    depends = {wrt}
    for j, (op, refs) in enumerate(program):
        if any(r in depends for r in refs):
            depends.add(nargs + j)
    adjoint = {last: "g"}
    for j in reversed(range(len(program))):
        r = nargs + j
        if r not in adjoint:
            continue
        op, refs = program[j]
        terms = RULES[op](adjoint[r], [ref(x) for x in refs], ref(r))
        for x, term in zip(refs, terms):
            if x not in depends or term is None:
                continue
            if x in adjoint:
                lines.append(f"    d{x} = d{x} + ({term})")
            else:
                lines.append(f"    d{x} = {term}")
            adjoint[x] = f"d{x}"
    lines.append(f"    return {adjoint.get(wrt, 'ZERO')}")
    return "\n".join(lines) + "\n"


def gradient_key(expr):
    """The gradient program of ``expr`` (``wrt`` set) with the operand's own
    name taken out: two operands with equal keys have equal gradients (an
    add's two operands, before any broadcast reduction), so one kernel run
    serves both (pyflow/graph/passes/fusion.py)."""
    import re
    wrt = expr[2]
    return re.sub(rf"\bd{wrt}\b", "d_wrt", scalar_source(expr))


def describe(expr):
    """A short readable name: ``mul+add+gelu`` (``d/da0`` appended for a gradient)."""
    program, _, wrt = expr
    text = "+".join(op for op, _ in program)
    return text if wrt is None else f"d({text})/da{wrt}"


def n_operands(expr):
    return len(expr[1]) + (expr[2] is not None)


def operand_scalars(expr):
    """Per kernel operand (``g`` first for a gradient): True where it is a number."""
    return ((False,) if expr[2] is not None else ()) + tuple(expr[1])


# ------------------------------------------------------------------ compilation
def _float32_clone(fn):
    """``fn`` in float32 with the fast math functions: ``activation``'s float32
    clone, with integer literals made float32 too (the ``0`` of relu's ``0 if x < 0
    else x`` would join int64 with float32, which numba types as float64)."""
    clone = float32_version(fn).py_func
    code = clone.__code__.replace(co_consts=tuple(np.float32(c) if type(c) is int else c
                                                  for c in clone.__code__.co_consts))
    fn32 = _pytypes.FunctionType(code, clone.__globals__, clone.__name__)
    return njit(inline="always", error_model="numpy", fastmath=FASTMATH)(fn32)


_namespaces = {}


def namespace(dtype):
    """Globals of the generated source on the CPU: ``f_<op>`` and the constants."""
    dtype = np.dtype(dtype)
    ns = _namespaces.get(dtype)
    if ns is None:
        ns = {k: dtype.type(v) for k, v in CONSTANTS.items()}
        for name, fn in SCALAR_FUNCTIONS.items():
            ns[f"f_{name}"] = (_float32_clone(fn) if dtype == np.float32 else
                               njit(inline="always", error_model="numpy")(fn))
        _namespaces[dtype] = ns
    return ns


def scalar_function(expr, dtype, ns):
    """The generated scalar function of ``expr`` with globals ``ns``."""
    ns = dict(ns)
    exec(compile(scalar_source(expr), f"<fused {describe(expr)}>", "exec"), ns)
    return ns["fused"]


_ufuncs = {}


def ufunc(expr, dtype):
    """The compiled NumPy ufunc of ``expr`` for ``dtype`` data (cached)."""
    dtype = np.dtype(dtype)
    key = (expr, dtype)
    u = _ufuncs.get(key)
    if u is None:
        fn = scalar_function(expr, dtype, namespace(dtype))
        t = "float32" if dtype == np.float32 else "float64"
        sig = f"{t}({','.join([t] * n_operands(expr))})"
        fast = FASTMATH if dtype == np.float32 else False
        u = _ufuncs[key] = vectorize([sig], nopython=True, fastmath=fast)(fn).ufunc
    return u


def check_operands(expr, operands, is_array):
    """The floating dtype of the operands; clear errors for anything else."""
    check_expr(expr)
    if len(operands) != n_operands(expr):
        raise TypeError(f"fused_elementwise: {describe(expr)} takes {n_operands(expr)} "
                        f"operands, got {len(operands)}")
    dtype = None
    for i, (a, is_scalar) in enumerate(zip(operands, operand_scalars(expr))):
        if is_scalar:
            if not isinstance(a, (int, float, np.floating, np.integer)) or isinstance(a, bool):
                raise TypeError(f"fused_elementwise: operand {i} must be a number, "
                                f"got {type(a).__name__}")
            continue
        if not is_array(a):
            raise TypeError(f"fused_elementwise: operand {i} must be an array, "
                            f"got {type(a).__name__}")
        if np.dtype(a.dtype) not in DTYPES:
            raise TypeError(f"fused_elementwise: operand {i} has dtype {a.dtype}; "
                            f"fused kernels take float32 or float64")
        if dtype is None:
            dtype = np.dtype(a.dtype)
        elif np.dtype(a.dtype) != dtype:
            raise TypeError(f"fused_elementwise: operands must share one dtype, got "
                            f"{dtype} and {a.dtype} (operand {i})")
    if dtype is None:
        raise TypeError("fused_elementwise: at least one operand must be an array")
    return dtype


# ------------------------------------------------------------------ the fast loop
# numba's ufunc loop is generic over strides, so LLVM does not vectorize it
# (measured: 13 ms for gelu(x * w + b) * 0.5 + x on 4M float32).  The usual
# operands of a model -- whole tensors and rows/columns broadcast against them
# -- coalesce to at most 2 dimensions where each operand's inner stride is 1
# or 0; for those a generated loop with the inner strides fixed at compile
# time vectorizes and runs in parallel over rows.  Anything else takes the ufunc.
# Below this many elements one thread is faster: these loops are memory-bound,
# and waking the pool costs tens of microseconds (measured on 2 cores: add+relu
# and mul+gelu at 131K/524K/2M, 49/266/934 us serial).
PARALLEL_MIN = 1 << 19
SPLIT = 64                 # pieces a single coalesced row is cut into for prange


def _loop_source(scalars, pattern, parallel):
    """``loop(out, rows, cols, a0, a0_rs, ...)``: out[r, c] = fused(a0[...], ...);
    ``pattern[k]`` is 1 (inner stride 1) or 0 (broadcast along the row).  Each
    row is sliced out first, so the inner loop indexes from 0 with a
    non-negative counter: no wraparound checks, and LLVM vectorizes it."""
    params, rows, args = [], [], []
    arrays = iter(pattern)
    for k, s in enumerate(scalars):
        if s:
            params.append(f"s{k}")
            args.append(f"s{k}")
        else:
            params.append(f"a{k}, a{k}_rs")
            if next(arrays):
                rows.append(f"x{k} = a{k}[r * a{k}_rs:r * a{k}_rs + cols]")
                args.append(f"x{k}[c]")
            else:
                rows.append(f"x{k} = a{k}[r * a{k}_rs]")
                args.append(f"x{k}")
    rng = "prange" if parallel else "range"
    body = "".join(f"        {line}\n" for line in rows)
    return (f"def loop(out, rows, cols, {', '.join(params)}):\n"
            f"    for r in {rng}(rows):\n"
            f"        o = out[r * cols:(r + 1) * cols]\n"
            f"{body}"
            f"        for c in range(cols):\n"
            f"            o[c] = fused({', '.join(args)})\n")


_loops = {}


def _loop(expr, dtype, pattern, parallel):
    key = (expr, dtype, pattern, parallel)
    fn = _loops.get(key)
    if fn is None:
        ns = {"prange": prange, "fused": njit(inline="always", error_model="numpy",
                                              fastmath=FASTMATH if dtype == np.float32 else False)(
            scalar_function(expr, dtype, namespace(dtype)))}
        exec(compile(_loop_source(operand_scalars(expr), pattern, parallel),
                     f"<fused loop {describe(expr)}>", "exec"), ns)
        fn = _loops[key] = njit(nogil=True, parallel=parallel, error_model="numpy",
                                fastmath=FASTMATH if dtype == np.float32 else False)(ns["loop"])
    return fn


def _rows(shape, arrays):
    """(rows, cols, [(flat array, row stride, inner stride)]) when every array
    coalesces to (rows, cols) with inner stride 0 or 1 over ``shape``; else None."""
    per = []
    for a in arrays:
        if any(st < 0 or st % a.itemsize for st in a.strides):
            return None
        b = np.broadcast_to(a, shape)
        per.append([st // a.itemsize for st in b.strides])
    dims = [d for d, n in enumerate(shape) if n != 1]
    sizes = [shape[d] for d in dims]
    per = [[st[d] for d in dims] for st in per]
    d = len(sizes) - 1
    while d > 0:                     # merge neighbours contiguous in every operand
        if all(st[d - 1] == st[d] * sizes[d] for st in per):
            sizes[d - 1] *= sizes[d]
            del sizes[d]
            for st in per:
                del st[d - 1]
        d -= 1
    if len(sizes) > 2:
        return None
    sizes = [1] * (2 - len(sizes)) + sizes
    per = [[0] * (2 - len(st)) + st for st in per]
    if any(st[1] not in (0, 1) for st in per):
        return None
    flats = []
    for a, (rs, cs) in zip(arrays, per):
        span = 1 + (sizes[0] - 1) * rs + (sizes[1] - 1) * cs
        flats.append((np.lib.stride_tricks.as_strided(a, (span,), (a.itemsize,)) if a.ndim
                      else a.reshape(1), rs, cs))
    return sizes[0], sizes[1], flats


def _run_loop(expr, dtype, args, shape):
    """The fast loop, or None when the operands' layout does not fit it."""
    scalars = operand_scalars(expr)
    arrays = [a for a, s in zip(args, scalars) if not s]
    layout = _rows(shape, arrays)
    if layout is None:
        return None
    rows, cols, flats = layout
    parallel = rows * cols >= PARALLEL_MIN
    if parallel and rows == 1 and cols % SPLIT == 0:
        # Whole tensors coalesce to one row, and the loop is parallel over rows:
        # cut the row into SPLIT pieces (an operand broadcast along it stays put).
        rows, cols = SPLIT, cols // SPLIT
        flats = [(f, cols if cs else 0, cs) for f, _, cs in flats]
    out = np.empty(shape, dtype)
    pattern = tuple(cs for _, _, cs in flats)
    call, flat = [], iter(flats)
    for a, s in zip(args, scalars):
        if s:
            call.append(a)
        else:
            f, rs, _ = next(flat)
            call += [f, rs]
    _loop(expr, dtype, pattern, parallel)(out.reshape(-1), rows, cols, *call)
    return out


@register("fused_elementwise", "cpu")
def fused_elementwise(expr, *operands, out=None):
    """Evaluate fused expression ``expr`` (see module docstring) on NumPy
    arrays and numbers; arrays broadcast as in NumPy."""
    operands = [np.asarray(a) if isinstance(a, np.generic) and not s else a   # 0-d data
                for a, s in zip(operands, operand_scalars(expr))]
    dtype = check_operands(expr, operands, lambda a: isinstance(a, np.ndarray))
    args = [dtype.type(a) if s else a for a, s in zip(operands, operand_scalars(expr))]
    shapes = [a.shape for a, s in zip(operands, operand_scalars(expr)) if not s]
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        raise ValueError(f"fused_elementwise: operand shapes {shapes} are not "
                         f"broadcastable") from None
    if out is None and len(shape) and 0 not in shape:
        res = _run_loop(expr, dtype, args, shape)
        if res is not None:
            return res
    res = ufunc(expr, dtype)(*args, out=out)
    return res if isinstance(res, np.ndarray) else np.asarray(res).reshape(shape)
