"""Reduction ops, datatypes and ``reduceCopy`` (NCCL ``src/device/reduce_kernel.h``, ``common_kernel.h``;
op encoding from ``hostToDevRedOp`` in ``src/enqueue.cc``).

``reduce_copy(srcs, dsts)`` follows ``reduceCopyPacks``: ``acc = preOp(srcs[0])`` when srcs[0] is the user input,
then ``acc = fn(acc, srcs[i])`` in order, then the post-op, then ``acc`` is stored to every dst.
Avg is NCCL's: floating types multiply the *local input* by ``1/nRanks`` converted to the element type
(``PreMulSum``); integer types sum and the owner of each chunk divides once (``SumPostDiv``, truncating toward 0).
Each step is one numpy ufunc over a whole slice: no Python loop per element.  fp16/bf16 ufuncs compute in fp32
and round once, which is exactly the native ``__hadd``/``__hmul`` result (fp32 has more than 2p+2 bits).
Min and max of floating types are NCCL's ``fminf``/``fmaxf`` (float), ``fmin``/``fmax`` (double) and
``__hmin``/``__hmax`` (half, bfloat16 on sm_80+): a NaN operand is dropped (max(NaN, 1) = 1), and two NaNs give the
canonical NaN of the type (all mantissa bits set), as the GPU's min/max instructions return; max(+0, -0) is +0 and
min(+0, -0) is -0 in either order (IEEE 754-2019's maximum/minimum; fmax leaves it open).  Integers compare.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

# ncclDataType_t codes, NCCL's names (src/include/nccl_common.h / nccl.h).
DTYPES: dict[str, np.dtype] = {
    "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8), "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32), "int64": np.dtype(np.int64), "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16), "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
}
DTYPE_CODES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
               "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
# nccl-tests spellings for -d.
DTYPE_ALIASES = {"char": "int8", "int": "int32", "half": "float16", "float": "float32", "double": "float64",
                 "bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}  # ncclRedOp_t order
_UFUNC = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum, "avg": np.add}
_FLOAT_MINMAX = {"max": np.fmax, "min": np.fmin}
# The canonical NaN of each floating type (PTX min/max and __hmin/__hmax when both inputs are NaN).
CANONICAL_NAN = {2: np.uint16(0x7FFF), 4: np.uint32(0x7FFFFFFF), 8: np.uint64(0x7FFFFFFFFFFFFFFF)}


_NAME_OF = {d: name for name, d in DTYPES.items()}


def dtype_name(dtype) -> str:
    name = _NAME_OF.get(np.dtype(dtype))
    if name is None:
        raise TypeError(f"unsupported datatype {np.dtype(dtype)} (NCCL types: {', '.join(DTYPES)})")
    return name


def parse_dtype(name: str) -> str:
    key = DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in DTYPES:
        raise ValueError(f"unknown datatype {name!r} (choose from {', '.join(DTYPES)})")
    return key


def parse_op(name: str) -> str:
    key = name.lower()
    if key not in OPS:
        raise ValueError(f"unknown reduction op {name!r} (choose from {', '.join(OPS)})")
    return key


@dataclass(frozen=True)
class RedOp:
    """``ncclDevRedOpFull``: the device op plus its scalar argument."""
    name: str
    dtype: np.dtype
    nranks: int

    @property
    def fn(self):
        if self.name in _FLOAT_MINMAX and self.is_float:
            return _NAN_DROPPING[self.name]
        return _UFUNC[self.name]

    @property
    def is_float(self) -> bool:
        return self.dtype.kind == "f" or self.dtype == DTYPES["bfloat16"]

    @property
    def premul(self):
        """PreMulSum scalar (float Avg): 1/nRanks converted to the element type, or None."""
        if self.name == "avg" and self.is_float:
            scalar = 1.0 / self.nranks if self.dtype == np.float64 else np.float32(1.0 / self.nranks)
            return np.array(scalar).astype(self.dtype)[()]
        return None

    @property
    def postdiv(self) -> int:
        """SumPostDiv divisor (integer Avg), 0 if none."""
        return self.nranks if (self.name == "avg" and not self.is_float) else 0


def _minmax_nan_dropping(ufunc):
    """fmin/fmax, then both-NaN results set to the canonical NaN (numpy would keep the first NaN's payload), and
    +0 against -0 decided by sign, whatever the order: max gives +0, min gives -0 (``signed_zero``).  numpy's
    vector loop and its scalar tail answer that tie differently, and NCCL's LL and Simple put the operands in
    opposite orders, so only an order-free rule gives every path the same bits."""
    def apply(a, b, out):
        zeros = (a == 0) & (b == 0)
        tie = signed_zero(ufunc is np.fmax, a[zeros], b[zeros]) if zeros.any() else None  # before out (maybe a)
        with np.errstate(invalid="ignore"):
            ufunc(a, b, out=out)
        if tie is not None:
            out[zeros] = tie
        nan = out != out
        if nan.any():
            out.view(CANONICAL_NAN[out.dtype.itemsize].dtype)[nan] = CANONICAL_NAN[out.dtype.itemsize]
        return out
    return apply


def signed_zero(larger: bool, a, b):
    """max/min of two zeros by sign: +0 + -0 = +0 for max; -(-a - b) is -0 unless both are +0, for min."""
    return a + b if larger else -(-a - b)


_NAN_DROPPING = {name: _minmax_nan_dropping(uf) for name, uf in _FLOAT_MINMAX.items()}


def post_div(acc: np.ndarray, divisor: int) -> None:
    """``FuncSumPostDiv::divide`` in place: |x| / divisor, sign restored (truncation toward zero)."""
    if acc.dtype.kind == "u":
        np.floor_divide(acc, acc.dtype.type(divisor), out=acc)
        return
    u = acc.view(acc.dtype.str.replace("i", "u"))
    neg = acc < 0
    mag = np.where(neg, np.negative(u), u)  # unsigned negate == T(-x): also right for INT_MIN
    np.floor_divide(mag, mag.dtype.type(divisor), out=mag)
    u[...] = np.where(neg, np.negative(mag), mag)


def reduce_copy(op: RedOp, srcs: list, dsts: list, pre_op: bool, post_op: bool) -> None:
    """``reduceCopy``: all arrays have the same length; ``pre_op`` means srcs[0] is the user input."""
    if len(dsts[0]) == 0:
        return
    acc = dsts[0]
    scalar = op.premul if pre_op else None
    if scalar is not None:
        np.multiply(srcs[0], scalar, out=acc)
        first = acc
    else:
        first = srcs[0]
    if len(srcs) == 1:
        if first is not acc:
            np.copyto(acc, first)
    else:
        op.fn(first, srcs[1], out=acc)
        for extra in srcs[2:]:
            op.fn(acc, extra, out=acc)
    if post_op and op.postdiv:
        post_div(acc, op.postdiv)
    for d in dsts[1:]:
        np.copyto(d, acc)
