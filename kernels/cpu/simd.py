"""A 64-byte vector value for numba kernels that need a register tile.

numba's pipeline runs LLVM's loop vectorizer but not its SLP vectorizer
(``NUMBA_SLP_VECTORIZE`` is off by default), and the loop vectorizer does not
keep a tile of accumulators in registers across a reduction loop: a plain
``acc[t, c] += x * w[c]`` over a (6, 16) local array ran at 3.3 GFLOP/s where
the same loop over explicit vector values runs at 71 (AMD EPYC, one core).
So the few kernels that need a register tile (``conv_direct.py``) hold it in
values of the type below, each lowered to one LLVM vector: 16 float32 or 8
float64 lanes, one zmm register on AVX-512 and two ymm on AVX2 (LLVM splits
it), whatever the host.

The operations are the handful a blocked kernel needs; ``idx`` counts
elements from ``arr``'s first, with no bounds check and no wrap-around of
negative indices (the caller's offset tables stay inside the array):

* ``vzero(arr)``                a vector of zeros of ``arr``'s dtype
* ``vload(arr, idx)``           ``arr.flat[idx:idx + LANES]``
* ``vbroadcast(arr, idx)``      ``arr.flat[idx]`` in every lane
* ``vfma(a, b, acc)``           ``a * b + acc``, lane by lane, fused
* ``vadd(a, b)``                ``a + b``, lane by lane
* ``vstore(arr, idx, v)``       ``arr.flat[idx:idx + LANES] = v``
* ``vlane(v, i)``               lane ``i`` as a scalar
* ``vscatter(arr, idx, stride, v, count)``
                                ``arr.flat[idx + l*stride] = v[l]`` for the
                                first ``count`` lanes (a constant lane index
                                each: ``vlane`` in a loop spills the vector)
* ``vlanes(arr)``               LANES for ``arr``'s dtype, a compile-time constant
* ``at(arr, idx)``              ``arr.flat[idx]`` for any dtype, without numba's
                                wrap-around of negative indices (which costs a
                                cmov chain inside a loop whose index LLVM cannot
                                prove >= 0)
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

VECTOR_BYTES = 64


def lanes(dtype):
    """Lanes of one vector of ``dtype`` (16 for float32, 8 for float64)."""
    return VECTOR_BYTES // dtype.itemsize


class Vector(types.Type):
    """``LANES`` scalars of ``dtype`` held in one LLVM vector."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.count = VECTOR_BYTES // (dtype.bitwidth // 8)
        super().__init__(name=f"Vector({dtype} x {self.count})")


@register_model(Vector)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        element = dmm.lookup(fe_type.dtype).get_value_type()
        super().__init__(dmm, fe_type, ir.VectorType(element, fe_type.count))


def _check_float_array(arr, what):
    if not (isinstance(arr, types.Array) and isinstance(arr.dtype, types.Float)):
        raise TypeError(f"{what}: expected a float32/float64 array, got {arr}")


def _address(context, builder, arr_type, arr, idx):
    data = context.make_array(arr_type)(context, builder, arr).data
    return builder.gep(data, [idx], inbounds=True)


@intrinsic
def vzero(typingctx, arr):
    _check_float_array(arr, "vzero")
    vt = Vector(arr.dtype)

    def codegen(context, builder, sig, args):
        return ir.Constant(context.get_value_type(vt), None)
    return vt(arr), codegen


@intrinsic
def vload(typingctx, arr, idx):
    _check_float_array(arr, "vload")
    vt = Vector(arr.dtype)

    def codegen(context, builder, sig, args):
        ptr = _address(context, builder, sig.args[0], args[0], args[1])
        vptr = builder.bitcast(ptr, context.get_value_type(vt).as_pointer())
        return builder.load(vptr, align=sig.args[0].dtype.bitwidth // 8)
    return vt(arr, idx), codegen


@intrinsic
def vbroadcast(typingctx, arr, idx):
    _check_float_array(arr, "vbroadcast")
    vt = Vector(arr.dtype)

    def codegen(context, builder, sig, args):
        scalar = builder.load(_address(context, builder, sig.args[0], args[0], args[1]))
        lt = context.get_value_type(vt)
        one = builder.insert_element(ir.Constant(lt, ir.Undefined), scalar,
                                     ir.Constant(ir.IntType(32), 0))
        mask = ir.Constant(ir.VectorType(ir.IntType(32), vt.count), [0] * vt.count)
        return builder.shuffle_vector(one, ir.Constant(lt, ir.Undefined), mask)
    return vt(arr, idx), codegen


@intrinsic
def vfma(typingctx, a, b, acc):
    if not (isinstance(a, Vector) and a == b == acc):
        raise TypeError(f"vfma: expected three vectors of one dtype, got {a}, {b}, {acc}")

    def codegen(context, builder, sig, args):
        vt = args[0].type
        suffix = "f32" if sig.args[0].dtype.bitwidth == 32 else "f64"
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt] * 3),
                                             f"llvm.fma.v{vt.count}{suffix}")
        return builder.call(fma, list(args))
    return a(a, b, acc), codegen


@intrinsic
def vadd(typingctx, a, b):
    if not (isinstance(a, Vector) and a == b):
        raise TypeError(f"vadd: expected two vectors of one dtype, got {a}, {b}")

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])
    return a(a, b), codegen


@intrinsic
def vstore(typingctx, arr, idx, v):
    _check_float_array(arr, "vstore")
    if not (isinstance(v, Vector) and v.dtype == arr.dtype):
        raise TypeError(f"vstore: expected a vector of {arr.dtype}, got {v}")

    def codegen(context, builder, sig, args):
        ptr = _address(context, builder, sig.args[0], args[0], args[1])
        builder.store(args[2], builder.bitcast(ptr, args[2].type.as_pointer()),
                      align=sig.args[0].dtype.bitwidth // 8)
        return context.get_dummy_value()
    return types.void(arr, idx, v), codegen


@intrinsic
def vlane(typingctx, v, i):
    if not isinstance(v, Vector):
        raise TypeError(f"vlane: expected a vector, got {v}")

    def codegen(context, builder, sig, args):
        return builder.extract_element(args[0], args[1])
    return v.dtype(v, i), codegen


@intrinsic
def vlanes(typingctx, arr):
    _check_float_array(arr, "vlanes")
    count = Vector(arr.dtype).count

    def codegen(context, builder, sig, args):
        return ir.Constant(ir.IntType(64), count)
    return types.int64(arr), codegen


@intrinsic
def vscatter(typingctx, arr, idx, stride, v, count):
    _check_float_array(arr, "vscatter")
    if not (isinstance(v, Vector) and v.dtype == arr.dtype):
        raise TypeError(f"vscatter: expected a vector of {arr.dtype}, got {v}")

    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        base, step, vec = args[1], args[2], args[3]
        count = context.cast(builder, args[4], sig.args[4], types.int64)
        i64 = ir.IntType(64)
        for lane in range(sig.args[3].count):
            with builder.if_then(builder.icmp_signed("<", ir.Constant(i64, lane), count),
                                 likely=True):
                at = builder.add(base, builder.mul(step, ir.Constant(i64, lane)))
                builder.store(builder.extract_element(vec, ir.Constant(ir.IntType(32), lane)),
                              builder.gep(data, [at], inbounds=True))
        return context.get_dummy_value()
    return types.void(arr, types.int64, types.int64, v, count), codegen


@intrinsic
def at(typingctx, arr, idx):
    if not isinstance(arr, types.Array):
        raise TypeError(f"at: expected an array, got {arr}")

    def codegen(context, builder, sig, args):
        return builder.load(_address(context, builder, sig.args[0], args[0], args[1]))
    return arr.dtype(arr, idx), codegen
