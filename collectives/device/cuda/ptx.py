"""The inline PTX the kernels need and numba does not give (NCCL ``src/device/op128.h``: ``ld_volatile_global``,
``st_relaxed_sys_global``, ``fence_acq_rel_sys``, ``load128`` / ``store128``; ``src/device/common.h``:
``barrier_sync`` and ``barrier_red_or``), written as numba intrinsics the way ``clock._globaltimer`` is.

Every access names its array and index, as ``arr[i]`` would; the intrinsic computes the element's address and
hands it to one PTX instruction, after ``cvta.to.global`` (numba's pointers are generic, as NCCL's are before
``cvta_to_global``).  Every statement is ``asm volatile`` with a memory clobber, so the compiler neither drops a
poll, nor hoists it out of its loop, nor moves other loads and stores across it.
Only for a real GPU: under numba's simulator ``sync.py`` uses plain Python reads and writes instead.  Callers reach
these through the module (``ptx.ld_volatile``), never ``from .ptx import``: numba's disk cache keys a kernel by a
pickle of what its functions refer to, an intrinsic pickles with a random id, and a module pickles by name.

* ``ld_volatile(arr, i)``: ``ld.volatile.global.u64``, the poll of head, tail and LL lines (on sm_70 and later a
  volatile access is a relaxed one at system scope: it sees a store from another GPU or the host).
* ``st_relaxed_sys(arr, i, v)``: ``st.relaxed.sys.global.u64``, the store that publishes a step.
* ``st_volatile(arr, i, v)``: ``st.volatile.global.u64``, an LL half-line (data and flag in one 8-byte word).
* ``ld_volatile2`` / ``st_volatile2``: 16 bytes in one access (``.v2.u64``), LL128's unit.
* ``fence_acq_rel_sys()``: ``fence.acq_rel.sys``.
* ``globaltimer()``: ``%globaltimer``, nanoseconds, the same on every SM (the spin deadline's clock).
* ``bar_red_or(name, nthreads, vote)``: ``barrier.red.or.pred``: the named barrier ``name`` of ``nthreads``
  threads (a multiple of 32), returning whether any of them voted true.  Deliberate difference: NCCL uses the
  ``.aligned`` form, which requires every thread of a warp to reach the same instruction together; here the
  polling thread arrives from its own branch, and numba's lowering does not promise the warp reconverged, so the
  form without ``.aligned`` (allowed from sm_70) is used.
"""
from __future__ import annotations

import importlib

from llvmlite import ir

try:
    from numba.cuda.extending import intrinsic  # the numba-cuda package, and numba's own CUDA target
except ImportError:  # pragma: no cover - older numba
    from numba.core.extending import intrinsic
try:
    from numba.cuda import cgutils  # numba-cuda carries its own copy
except ImportError:
    from numba.core import cgutils

_I64, _I32 = ir.IntType(64), ir.IntType(32)


def _types(ty=None):
    """The type system the CUDA target typed ``ty`` with: recent numba-cuda has its own copy of numba's types
    (``numba.cuda.types``), numba's own CUDA target uses ``numba.core.types``; the intrinsics below test types by
    kind and build their signatures from the same system, so they serve both."""
    if ty is not None:
        return importlib.import_module(type(ty).__module__.rsplit(".", 1)[0])
    try:
        from numba.cuda import types as cuda_types
        if all(hasattr(cuda_types, a) for a in ("Array", "UniTuple", "int64", "none")):
            return cuda_types
    except ImportError:  # pragma: no cover
        pass
    from numba.core import types as core_types
    return core_types


def _kind(ty) -> str:
    return type(ty).__name__


def _is_int(ty) -> bool:
    return _kind(ty) in ("Integer", "IntegerLiteral", "Boolean", "BooleanLiteral")


def _is_word_array(arr) -> bool:
    return _kind(arr) == "Array" and str(arr.dtype) in ("int64", "uint64")


def _index_ok(idx) -> bool:
    if _kind(idx) in ("UniTuple", "Tuple"):
        return all(_is_int(t) for t in idx.types)
    return _is_int(idx)


def _asm(ret, args, text: str, constraints: str):
    return ir.InlineAsm(ir.FunctionType(ret, args), text, ",".join(filter(None, (constraints, "~{memory}"))),
                        side_effect=True)


def _address(context, builder, aryty, ary, idxty, idx):
    """The element's address as a 64-bit integer (no bounds check, as ``arr[i]`` in a kernel has none)."""
    arr = context.make_array(aryty)(context, builder, ary)
    if _kind(idxty) in ("UniTuple", "Tuple"):
        inds, tys = cgutils.unpack_tuple(builder, idx, len(idxty)), idxty.types
    else:
        inds, tys = [idx], [idxty]
    intp = _types(aryty).intp
    inds = [context.cast(builder, v, t, intp) for v, t in zip(inds, tys)]
    return builder.ptrtoint(cgutils.get_item_pointer(context, builder, aryty, arr, inds), _I64)


_GLOBAL = "{ .reg .u64 %nlg; cvta.to.global.u64 %nlg, $ADDR; "


@intrinsic
def ld_volatile(typingctx, arr, idx):
    if not (_is_word_array(arr) and _index_ok(idx)):
        return None

    def codegen(context, builder, sig, args):
        addr = _address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        text = _GLOBAL.replace("$ADDR", "$1") + "ld.volatile.global.u64 $0, [%nlg]; }"
        return builder.call(_asm(_I64, [_I64], text, "=l,l"), [addr])
    return arr.dtype(arr, idx), codegen


def _store(op: str):
    @intrinsic
    def store(typingctx, arr, idx, value):
        if not (_is_word_array(arr) and _index_ok(idx) and _is_int(value)):
            return None

        def codegen(context, builder, sig, args):
            addr = _address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            val = context.cast(builder, args[2], sig.args[2], sig.args[0].dtype)
            text = _GLOBAL.replace("$ADDR", "$0") + f"{op}.global.u64 [%nlg], $1; }}"
            builder.call(_asm(ir.VoidType(), [_I64, _I64], text, "l,l"), [addr, val])
            return context.get_dummy_value()
        return _types(arr).none(arr, idx, value), codegen
    return store


st_relaxed_sys = _store("st.relaxed.sys")
st_volatile = _store("st.volatile")


@intrinsic
def ld_volatile2(typingctx, arr, idx):
    """``load128``: words ``i`` and ``i + 1`` (16-byte aligned) in one access; returns both."""
    if not (_is_word_array(arr) and str(arr.dtype) == "uint64" and _index_ok(idx)):
        return None
    ret = _types(arr).UniTuple(arr.dtype, 2)

    def codegen(context, builder, sig, args):
        addr = _address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        text = _GLOBAL.replace("$ADDR", "$2") + "ld.volatile.global.v2.u64 {$0, $1}, [%nlg]; }"
        pair = builder.call(_asm(ir.LiteralStructType([_I64, _I64]), [_I64], text, "=l,=l,l"), [addr])
        return context.make_tuple(builder, ret, [builder.extract_value(pair, 0), builder.extract_value(pair, 1)])
    return ret(arr, idx), codegen


@intrinsic
def st_volatile2(typingctx, arr, idx, lo, hi):
    """``store128``: words ``i`` and ``i + 1`` (16-byte aligned) in one access."""
    if not (_is_word_array(arr) and str(arr.dtype) == "uint64" and _index_ok(idx) and _is_int(lo) and _is_int(hi)):
        return None

    def codegen(context, builder, sig, args):
        addr = _address(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        a = context.cast(builder, args[2], sig.args[2], sig.args[0].dtype)
        b = context.cast(builder, args[3], sig.args[3], sig.args[0].dtype)
        text = _GLOBAL.replace("$ADDR", "$0") + "st.volatile.global.v2.u64 [%nlg], {$1, $2}; }"
        builder.call(_asm(ir.VoidType(), [_I64, _I64, _I64], text, "l,l,l"), [addr, a, b])
        return context.get_dummy_value()
    return _types(arr).none(arr, idx, lo, hi), codegen


@intrinsic
def fence_acq_rel_sys(typingctx):
    def codegen(context, builder, sig, args):
        builder.call(_asm(ir.VoidType(), [], "fence.acq_rel.sys;", ""), [])
        return context.get_dummy_value()
    return _types().none(), codegen


@intrinsic
def bar_red_or(typingctx, name, nthreads, vote):
    """``barrier_red_or``: True on every thread of the barrier when any of them voted true."""
    if not all(_is_int(t) for t in (name, nthreads, vote)):
        return None
    T = _types(name)

    def codegen(context, builder, sig, args):
        ops = [context.cast(builder, v, t, T.int32) for v, t in zip(args, sig.args)]
        text = ("{ .reg .pred %nlv; .reg .pred %nla; setp.ne.u32 %nlv, $3, 0; "
                "barrier.red.or.pred %nla, $1, $2, %nlv; selp.u32 $0, 1, 0, %nla; }")
        got = builder.call(_asm(_I32, [_I32, _I32, _I32], text, "=r,r,r,r"), ops)
        return builder.icmp_unsigned("!=", got, ir.Constant(_I32, 0))
    return T.boolean(name, nthreads, vote), codegen


@intrinsic
def globaltimer(typingctx):
    def codegen(context, builder, sig, args):
        return builder.call(_asm(_I64, [], "mov.u64 $0, %globaltimer;", "=l"), [])
    return _types().int64(), codegen
