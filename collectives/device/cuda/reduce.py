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
from .api import cuda

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


def make_ops(op: str, kind: str):
    """(fn, premul, postdiv) device functions: ``fn(a, b)``; ``premul(x, s)`` the Avg pre-multiply of floats
    (identity otherwise); ``postdiv(x, n)`` the integer Avg's final division (identity otherwise)."""
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
        @cuda.jit(device=True)
        def premul(x, s):
            return x * s
    else:
        @cuda.jit(device=True)
        def premul(x, s):
            return x

    if op == "avg" and kind == "int":
        @cuda.jit(device=True)
        def postdiv(x, n):
            if x >= 0:
                return x // n
            return -((-x) // n)
    else:
        @cuda.jit(device=True)
        def postdiv(x, n):
            return x
    return fn, premul, postdiv
