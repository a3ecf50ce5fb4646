"""A vector of ``LANES`` doubles for numba kernels: row loads and stores, IEEE arithmetic,
comparisons and selects, emitted as LLVM vector IR.

Design: docs/design/kernels.md, "Lanes". numba leaves LLVM's SLP vectorizer off and its
loop vectorizer cannot keep a chain's accumulator in a register across an outer loop, so
``lanes.py`` states its vectors explicitly: ``acc = acc + load(h, k)`` is one vector add
whose accumulator stays in a register. Every operation is the scalar one applied lane by
lane (an LLVM vector ``fadd`` is ``LANES`` IEEE additions), so each lane's results are
bit-identical to the scalar kernel's; nothing here allows contraction or reassociation.
"""

import operator
from typing import Any

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core import config as numba_config
from numba.extending import intrinsic, models, overload, register_model

from atc_stream.state.layout import LANES

_DOUBLE = ir.DoubleType()
_VECTOR = ir.VectorType(_DOUBLE, LANES)
_MASK = ir.VectorType(ir.IntType(1), LANES)
_I32 = ir.IntType(32)


class LaneVector(types.Type):
    """``LANES`` doubles, one per stream of a block."""

    def __init__(self) -> None:
        super().__init__(name=f"LaneVector({LANES})")


class LaneMask(types.Type):
    """``LANES`` booleans: a comparison of two lane vectors."""

    def __init__(self) -> None:
        super().__init__(name=f"LaneMask({LANES})")


class HalfVector(types.Type):
    """``LANES // 2`` doubles: the streams of one half of a block."""

    def __init__(self) -> None:
        super().__init__(name=f"HalfVector({LANES // 2})")


lane_vector = LaneVector()
lane_mask = LaneMask()
half_vector = HalfVector()
_HALF = ir.VectorType(_DOUBLE, LANES // 2)
#: the LLVM vector each vector type is
_IR_VECTOR = {lane_vector: _VECTOR, half_vector: _HALF}


@register_model(LaneVector)
class _LaneVectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _VECTOR)


@register_model(HalfVector)
class _HalfVectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _HALF)


@register_model(LaneMask)
class _LaneMaskModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _MASK)


def _c_array(ary, dtype, ndim=None) -> bool:
    """A C-ordered array of ``dtype`` (and ``ndim`` dimensions, when given)."""
    return (
        isinstance(ary, types.Array)
        and ary.dtype == dtype
        and ary.layout == "C"
        and (ndim is None or ary.ndim == ndim)
    )


def _is_rows(ary) -> bool:
    return _c_array(ary, types.float64, 2)


def _row_pointer(context, builder, array_type, array, row_type, row, vector=_VECTOR, column=None):
    """Address of ``array[row, column]`` (default ``array[row, 0]``) as a pointer to a
    ``vector`` (``column`` an intp value).

    Every array of rows here is C-ordered with rows of exactly LANES doubles, so the row
    stride is the constant ``LANES * 8``, not read from the array: LLVM then folds a
    field's offset into the address (``192(%r13,%r9)``) instead of multiplying by a
    stride held in a register or on the stack at every load and store, which made the
    lane kernel ~15 % slower (docs/design/kernels.md, "Lanes")."""
    rows = context.make_array(array_type)(context, builder, array)
    row = context.cast(builder, row, row_type, types.intp)
    stride = ir.Constant(cgutils.intp_t, LANES * 8)
    address = builder.add(builder.ptrtoint(rows.data, cgutils.intp_t), builder.mul(row, stride))
    if column is not None:
        address = builder.add(address, builder.mul(column, ir.Constant(cgutils.intp_t, 8)))
    return builder.inttoptr(address, vector.as_pointer())


def _splat_value(context, builder, value_type, value, vector=_VECTOR):
    """A scalar (float or integer, converted as numba converts it) broadcast to a
    ``vector``; a vector is returned as it is."""
    if value_type in _IR_VECTOR:
        return value
    scalar = context.cast(builder, value, value_type, types.float64)
    undef = ir.Constant(vector, ir.Undefined)
    first = builder.insert_element(undef, scalar, ir.Constant(_I32, 0))
    width = vector.count
    zeros = ir.Constant(ir.VectorType(_I32, width), [0] * width)
    return builder.shuffle_vector(first, undef, zeros)


def _scalar(value_type) -> bool:
    return isinstance(value_type, (types.Float, types.Integer, types.Boolean))


def _operand(value_type) -> bool:
    return value_type == lane_vector or _scalar(value_type)


def _vector_type(a, b):
    """The vector type of an operation on ``a`` and ``b`` (one vector type, or that type
    and a scalar); None for anything else."""
    kinds = {t for t in (a, b) if t in _IR_VECTOR}
    if len(kinds) != 1 or not all(t in kinds or _scalar(t) for t in (a, b)):
        return None
    return kinds.pop()


def _load(typingctx, rows, row):
    """``rows[row, :]`` (a C-ordered ``(n, LANES)`` float64 array: rows of exactly LANES
    doubles, see ``_row_pointer``) as a lane vector."""
    if _is_rows(rows) and isinstance(row, types.Integer):

        def codegen(context, builder, signature, args):
            pointer = _row_pointer(
                context, builder, signature.args[0], args[0], signature.args[1], args[1]
            )
            return builder.load(pointer, align=8)

        return lane_vector(rows, row), codegen
    return None


load: Any = intrinsic(_load)


def _store(typingctx, rows, row, value):
    """``rows[row, :] = value`` (a lane vector, or a scalar for every lane)."""
    if _is_rows(rows) and isinstance(row, types.Integer) and _operand(value):

        def codegen(context, builder, signature, args):
            pointer = _row_pointer(
                context, builder, signature.args[0], args[0], signature.args[1], args[1]
            )
            vector = _splat_value(context, builder, signature.args[2], args[2])
            builder.store(vector, pointer, align=8)
            return context.get_dummy_value()

        return types.none(rows, row, value), codegen
    return None


store: Any = intrinsic(_store)


def _splat(typingctx, value):
    """``value`` in every lane."""
    if _scalar(value):

        def codegen(context, builder, signature, args):
            return _splat_value(context, builder, signature.args[0], args[0])

        return lane_vector(value), codegen
    return None


splat: Any = intrinsic(_splat)


# -- parts of a row: the window sums' vectors ----------------------------------------


def _part_intrinsics(kind) -> tuple[Any, Any, Any]:
    """``load``, ``store`` and ``splat`` of ``kind`` vectors, where a row of LANES doubles
    holds ``LANES // width`` of them: ``load(rows, row, part)`` is ``rows[row, part *
    width : (part + 1) * width]``."""
    vector = _IR_VECTOR[kind]
    width = vector.count

    def pointer(context, builder, signature, args):
        part = context.cast(builder, args[2], signature.args[2], types.intp)
        column = builder.mul(part, ir.Constant(cgutils.intp_t, width))
        return _row_pointer(
            context, builder, signature.args[0], args[0], signature.args[1], args[1], vector,
            column,
        )  # fmt: skip

    def load_part(typingctx, rows, row, part):
        if _is_rows(rows) and isinstance(row, types.Integer) and isinstance(part, types.Integer):

            def codegen(context, builder, signature, args):
                return builder.load(pointer(context, builder, signature, args), align=8)

            return kind(rows, row, part), codegen
        return None

    def store_part(typingctx, rows, row, part, value):
        if (
            _is_rows(rows)
            and isinstance(row, types.Integer)
            and isinstance(part, types.Integer)
            and (value == kind or _scalar(value))
        ):

            def codegen(context, builder, signature, args):
                value = _splat_value(context, builder, signature.args[3], args[3], vector)
                builder.store(value, pointer(context, builder, signature, args), align=8)
                return context.get_dummy_value()

            return types.none(rows, row, part, value), codegen
        return None

    def splat_part(typingctx, value):
        if _scalar(value):

            def codegen(context, builder, signature, args):
                return _splat_value(context, builder, signature.args[0], args[0], vector)

            return kind(value), codegen
        return None

    for function in (load_part, store_part, splat_part):
        function.__name__ = function.__qualname__ = f"{function.__name__}_{width}"
    return intrinsic(load_part), intrinsic(store_part), intrinsic(splat_part)


#: a row as one part (``part`` 0): lane vectors
load_whole, store_whole, splat_whole = _part_intrinsics(lane_vector)
#: a row as two parts, the block's first and second half of streams
load_half, store_half, splat_half = _part_intrinsics(half_vector)


def target_features() -> str:
    """The CPU features numba compiles for (as numba's codegen reads them)."""
    features = getattr(numba_config, "CPU_FEATURES", None)  # set by numba at import
    if features is not None:
        return features
    try:
        return llvm.get_host_cpu_features().flatten()
    except RuntimeError:  # a host LLVM cannot describe: assume the narrow registers
        return ""


#: Parts of a row the nine window sums of a family run in (``lanes.family_sums``): their
#: nine accumulators fit AVX-512's 32 registers as lane vectors, but a lane vector takes
#: two of AVX2's 16 (four of SSE2's), and they spilled to the stack on every row; as
#: halves they fit. Each lane's operations are the same either way.
SUM_PARTS = 1 if "+avx512f" in target_features() else 2
if SUM_PARTS == 1:
    load_sum, store_sum, splat_sum = load_whole, store_whole, splat_whole
else:
    load_sum, store_sum, splat_sum = load_half, store_half, splat_half


def _binary(instruction) -> Any:
    def vector_op(typingctx, a, b):
        kind = _vector_type(a, b)
        if kind is not None:

            def codegen(context, builder, signature, args):
                vector = _IR_VECTOR[signature.return_type]
                x = _splat_value(context, builder, signature.args[0], args[0], vector)
                y = _splat_value(context, builder, signature.args[1], args[1], vector)
                return getattr(builder, instruction)(x, y)

            return kind(a, b), codegen
        return None

    return intrinsic(vector_op)


add = _binary("fadd")
subtract = _binary("fsub")
multiply = _binary("fmul")
divide = _binary("fdiv")


def _compare(symbol, ordered) -> Any:
    def vector_compare(typingctx, a, b):
        if _operand(a) and _operand(b) and lane_vector in (a, b):

            def codegen(context, builder, signature, args):
                x = _splat_value(context, builder, signature.args[0], args[0])
                y = _splat_value(context, builder, signature.args[1], args[1])
                compare = builder.fcmp_ordered if ordered else builder.fcmp_unordered
                return compare(symbol, x, y)

            return lane_mask(a, b), codegen
        return None

    return intrinsic(vector_compare)


# numba's scalar comparisons: ordered, except != (true when either side is NaN)
less = _compare("<", True)
less_equal = _compare("<=", True)
greater = _compare(">", True)
greater_equal = _compare(">=", True)
equal = _compare("==", True)
not_equal = _compare("!=", False)


def _unary_intrinsic(name) -> Any:
    def vector_function(typingctx, a):
        if a == lane_vector:

            def codegen(context, builder, signature, args):
                signature_type = ir.FunctionType(_VECTOR, [_VECTOR])
                function = cgutils.get_or_insert_function(
                    builder.module, signature_type, f"{name}.v{LANES}f64"
                )
                return builder.call(function, [args[0]])

            return lane_vector(a), codegen
        return None

    return intrinsic(vector_function)


#: ``abs`` of each lane (numba's scalar ``abs`` is ``llvm.fabs`` too)
absolute = _unary_intrinsic("llvm.fabs")
#: ``math.floor`` of each lane, as a double (exact for the finite values it is used on)
floor = _unary_intrinsic("llvm.floor")


def _negative(typingctx, a):
    """``-a`` as numba computes it for a scalar: ``-0.0 - a``."""
    if a == lane_vector:

        def codegen(context, builder, signature, args):
            return builder.fsub(ir.Constant(_VECTOR, [-0.0] * LANES), args[0])

        return lane_vector(a), codegen
    return None


negative: Any = intrinsic(_negative)


def _where(typingctx, mask, a, b):
    """Lane by lane ``a if mask else b`` (either may be a scalar)."""
    if mask == lane_mask and _operand(a) and _operand(b):

        def codegen(context, builder, signature, args):
            x = _splat_value(context, builder, signature.args[1], args[1])
            y = _splat_value(context, builder, signature.args[2], args[2])
            return builder.select(args[0], x, y)

        return lane_vector(mask, a, b), codegen
    return None


where: Any = intrinsic(_where)


def _mask_binary(instruction) -> Any:
    def mask_op(typingctx, a, b):
        if a == lane_mask and b == lane_mask:

            def codegen(context, builder, signature, args):
                return getattr(builder, instruction)(args[0], args[1])

            return lane_mask(a, b), codegen
        return None

    return intrinsic(mask_op)


both = _mask_binary("and_")
either = _mask_binary("or_")


# -- Python operators on lane vectors and masks ------------------------------------


def _vector_operands(a, b) -> bool:
    return _operand(a) and _operand(b) and lane_vector in (a, b)


def _overload_binary(python_operator, vector_function, operands=_vector_operands):
    @overload(python_operator)
    def _overloaded(a, b):
        if operands(a, b):
            return lambda a, b: vector_function(a, b)
        return None


for _python, _vector in (
    (operator.add, add),
    (operator.sub, subtract),
    (operator.mul, multiply),
    (operator.truediv, divide),
):
    _overload_binary(_python, _vector, lambda a, b: _vector_type(a, b) is not None)
for _python, _vector in (
    (operator.lt, less),
    (operator.le, less_equal),
    (operator.gt, greater),
    (operator.ge, greater_equal),
    (operator.eq, equal),
    (operator.ne, not_equal),
):
    _overload_binary(_python, _vector)


@overload(operator.neg)
def _neg(a):
    if a == lane_vector:
        return lambda a: negative(a)
    return None


@overload(abs)
def _abs(a):
    if a == lane_vector:
        return lambda a: absolute(a)
    return None


@overload(operator.and_)
def _and(a, b):
    if a == lane_mask and b == lane_mask:
        return lambda a, b: both(a, b)
    return None


@overload(operator.or_)
def _or(a, b):
    if a == lane_mask and b == lane_mask:
        return lambda a, b: either(a, b)
    return None


# -- tiles: LANES rows of LANES doubles, one row per stream, to lane rows and back ---


def _transpose(builder, vectors):
    """Row ``i`` of the result is element ``i`` of every vector: the LANES x LANES
    transpose in log2(LANES) rounds of two-vector shuffles."""
    vectors = list(vectors)
    width = 1
    while width < LANES:
        shuffled = list(vectors)
        for i in range(LANES):
            if (i // width) % 2 == 0:
                j = i + width
                low = [e if (e // width) % 2 == 0 else LANES + e - width for e in range(LANES)]
                high = [e + width if (e // width) % 2 == 0 else LANES + e for e in range(LANES)]
                shuffled[i] = builder.shuffle_vector(
                    vectors[i], vectors[j], ir.Constant(ir.VectorType(_I32, LANES), low)
                )
                shuffled[j] = builder.shuffle_vector(
                    vectors[i], vectors[j], ir.Constant(ir.VectorType(_I32, LANES), high)
                )
        vectors = shuffled
        width *= 2
    return vectors


def _lane_addresses(context, builder, flat_type, flat, starts_type, starts, offset_type, offset):
    """``&flat.flat[starts[i] + offset]`` for each lane ``i`` (``flat`` C-ordered)."""
    base = builder.ptrtoint(
        context.make_array(flat_type)(context, builder, flat).data, cgutils.intp_t
    )
    first = context.make_array(starts_type)(context, builder, starts).data
    offset = context.cast(builder, offset, offset_type, types.intp)
    addresses = []
    for i in range(LANES):
        start = builder.load(builder.gep(first, [ir.Constant(cgutils.intp_t, i)]))
        element = builder.add(start, offset)
        address = builder.add(base, builder.mul(element, ir.Constant(cgutils.intp_t, 8)))
        addresses.append(builder.inttoptr(address, _VECTOR.as_pointer()))
    return addresses


def _is_flat_source(ary) -> bool:
    return _c_array(ary, types.float64)


def _is_starts(ary) -> bool:
    return _c_array(ary, types.int64, 1)


def _gather_tile(typingctx, source, starts, offset, rows, row):
    """``rows[row + t, i] = source.flat[starts[i] + offset + t]`` for ``t, i < LANES``:
    LANES consecutive doubles of each lane's stream, turned into LANES lane rows."""
    if (
        _is_flat_source(source)
        and _is_starts(starts)
        and isinstance(offset, types.Integer)
        and _is_rows(rows)
        and isinstance(row, types.Integer)
    ):

        def codegen(context, builder, signature, args):
            source_type, starts_type, offset_type, rows_type, row_type = signature.args
            addresses = _lane_addresses(
                context, builder, source_type, args[0], starts_type, args[1], offset_type, args[2]
            )
            columns = [builder.load(address, align=8) for address in addresses]
            row_value = context.cast(builder, args[4], row_type, types.intp)
            for t, vector in enumerate(_transpose(builder, columns)):
                index = builder.add(row_value, ir.Constant(cgutils.intp_t, t))
                pointer = _row_pointer(context, builder, rows_type, args[3], types.intp, index)
                builder.store(vector, pointer, align=8)
            return context.get_dummy_value()

        return types.none(source, starts, offset, rows, row), codegen
    return None


gather_tile: Any = intrinsic(_gather_tile)
