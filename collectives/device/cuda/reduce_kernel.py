"""Element operations of the reduction (NCCL ``src/device/reduce_kernel.h``: ``FuncSum``, ``FuncProd``,
``FuncMinMax``, ``FuncPreMulSum``, ``FuncSumPostDiv``), specialised per (op, kind) as the kernel's closures.

Kinds: ``int`` (wrapping integer arithmetic), ``float`` (float32/float64), ``half`` (float16: ``__hadd``,
``__hmul``, ``__hmax``/``__hmin``), ``bf16`` (bfloat16 carried as its uint16 bits: numba has no bfloat16 type).
bfloat16 math is NCCL's on sm_80+ ``__hadd``: both operands widened to float32, one float32 operation, rounded to
nearest even back to bfloat16; float32 has more than 2p+2 bits, so this equals the exactly rounded result, which is
what the CPU path's ``ml_dtypes`` gives (``collectives/device/reduce_copy.py``).
Min/max of floats drop a NaN operand (``fmaxf``); two NaNs keep the first operand and a +0/-0 tie keeps the first
operand (the CPU path's canonical NaN and its sign rule for zeros are not reproduced here yet).
"""
from __future__ import annotations

import numpy as np
from .numba_cuda import cuda

from .clock import SIMULATED

if SIMULATED:
    def f32_bits(f):
        return np.float32(f).view(np.uint32)

    def f32_from_bits(u):
        return np.uint32(u).view(np.float32)
else:  # pragma: no cover - needs a GPU
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def f32_bits(f):
        return np.uint32(libdevice.float_as_int(f))

    @cuda.jit(device=True)
    def f32_from_bits(u):
        return libdevice.int_as_float(np.int32(u))


@cuda.jit(device=True)
def bf16_to_f32(h):
    return f32_from_bits(np.uint32(h) << np.uint32(16))


@cuda.jit(device=True)
def f32_to_bf16(f):
    """Round to nearest even; a NaN stays a (quiet) NaN."""
    u = np.int64(f32_bits(f))
    if f != f:
        return np.uint16((u >> 16) | 0x40)
    return np.uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)


def kind_of(dtype) -> str:
    """The kernel kind of a numpy dtype (bfloat16 by its name; the kernel then sees uint16 bits)."""
    d = np.dtype(dtype)
    if d.name == "bfloat16":
        return "bf16"
    if d == np.float16:
        return "half"
    return "float" if d.kind == "f" else "int"


def _minmax(larger: bool):
    """``fmaxf``/``fminf`` (and ``__hmax``/``__hmin``): a NaN operand is dropped; compares natively, so it serves
    float32, float64 and half alike."""
    @cuda.jit(device=True)
    def fn(a, b):
        if b != b:
            return a
        if a != a:
            return b
        return (a if a >= b else b) if larger else (a if a <= b else b)
    return fn


def make_ops(op: str, kind: str, dtype=None):
    """(fn, premul, postdiv) device functions for ``dtype`` (the kernel's element type; its kind ``kind``):
    ``fn(a, b)``; ``premul(x, s)`` the Avg pre-multiply of floats (identity otherwise); ``postdiv(x, n)`` the
    integer Avg's final division (identity otherwise).

    Integers wrap in their own type, as NCCL's ``FuncSum<T>`` does in C: numba types ``int8 + int8`` as int64
    (and unsigned pairs as uint64), so every integer result is cast back to ``T`` (``wrap``) before it goes on,
    and Avg divides that wrapped sum: signed in int64, truncating toward zero as C's ``/``; unsigned in uint64
    (``uint64 // int64`` would be a float64 division in numba).  Float Avg multiplies with ``__fmul_rn`` on a GPU,
    so NVVM cannot fuse the pre-multiply into the next add (an FMA would round once where the reference rounds
    twice)."""
    T = np.dtype(dtype if dtype is not None else (np.int64 if kind == "int" else np.float32)).type
    if kind == "half":
        if op in ("sum", "avg"):
            @cuda.jit(device=True)
            def fn(a, b):
                return cuda.fp16.hadd(a, b)
        elif op == "prod":
            @cuda.jit(device=True)
            def fn(a, b):
                return cuda.fp16.hmul(a, b)
        else:
            fn = _minmax(op == "max")
    elif kind == "bf16":
        if op in ("sum", "avg"):
            @cuda.jit(device=True)
            def fn(a, b):
                return f32_to_bf16(bf16_to_f32(a) + bf16_to_f32(b))
        elif op == "prod":
            @cuda.jit(device=True)
            def fn(a, b):
                return f32_to_bf16(bf16_to_f32(a) * bf16_to_f32(b))
        else:
            larger = op == "max"

            @cuda.jit(device=True)
            def fn(a, b):
                x, y = bf16_to_f32(a), bf16_to_f32(b)
                if y != y:
                    return a
                if x != x:
                    return b
                return (a if x >= y else b) if larger else (a if x <= y else b)
    elif kind == "int":
        if op in ("sum", "avg"):
            @cuda.jit(device=True)
            def fn(a, b):
                return T(a + b)
        elif op == "prod":
            @cuda.jit(device=True)
            def fn(a, b):
                return T(a * b)
        else:
            larger = op == "max"

            @cuda.jit(device=True)
            def fn(a, b):
                return (a if a >= b else b) if larger else (a if a <= b else b)
    else:
        if op in ("sum", "avg"):
            @cuda.jit(device=True)
            def fn(a, b):
                return a + b
        elif op == "prod":
            @cuda.jit(device=True)
            def fn(a, b):
                return a * b
        else:
            fn = _minmax(op == "max")

    if op == "avg" and kind == "half":
        @cuda.jit(device=True)
        def premul(x, s):
            return cuda.fp16.hmul(x, s)
    elif op == "avg" and kind == "bf16":
        @cuda.jit(device=True)
        def premul(x, s):
            return f32_to_bf16(bf16_to_f32(x) * bf16_to_f32(s))
    elif op == "avg" and kind == "float":
        premul = _fmul_rn(T)
    else:
        @cuda.jit(device=True)
        def premul(x, s):
            return x

    if op == "avg" and kind == "int" and np.dtype(T).kind == "u":
        @cuda.jit(device=True)
        def postdiv(x, n):
            return T(np.uint64(x) // np.uint64(n))
    elif op == "avg" and kind == "int":
        @cuda.jit(device=True)
        def postdiv(x, n):
            q, m = np.int64(x), np.int64(n)
            r = q // m  # floor; C truncates toward zero: one up when a negative sum leaves a remainder
            if q < 0 and r * m != q:
                r += 1
            return T(r)
    else:
        @cuda.jit(device=True)
        def postdiv(x, n):
            return x
    return fn, premul, postdiv


def _fmul_rn(T):
    """``x * s`` rounded once, never contracted into an FMA (libdevice ``__fmul_rn`` / ``__dmul_rn``)."""
    if SIMULATED:
        @cuda.jit(device=True)
        def premul(x, s):
            return x * s
        return premul
    mul = libdevice.dmul_rn if T is np.float64 else libdevice.fmul_rn  # pragma: no cover - needs a GPU

    @cuda.jit(device=True)
    def premul(x, s):  # pragma: no cover - needs a GPU
        return mul(x, s)
    return premul
