"""The LL and LL128 line kernels, compiled with numba (the loops of ``prims_ll.h`` / ``prims_ll128.h``).

They only move 64-bit words between contiguous data and FIFO lines; the reduction itself stays in numpy
(``reduce_copy``), because numba has no bfloat16.  Each kernel makes one pass and returns, so a waiting rank
never spins inside compiled code: the caller yields and calls again.

Ordering, which is what makes a torn line impossible on a CPU:
* LL: each 8-byte word carries 4 data bytes *and* the 32-bit flag, written by one aligned 8-byte store, which
  x86-64 makes atomic; a reader that sees the flag in a word sees that word's data.  A line is accepted only when
  both of its words carry the current flag (NCCL's 16-byte ``{data1, flag1, data2, flag2}``).
* LL128: data words 0..14 of every line are stored by ``ll128_pack``; the flag words (word 15 = ``step + 1``) by a
  *separate* call ``ll128_set_flags``.  x86 keeps stores in order (TSO), and nothing can be moved across the call
  boundary, so no reader sees a flag before the data of its line.  The reader mirrors it: ``ll128_ready`` loads
  the flags, and only a later call, ``ll128_unpack``, loads the data (x86 does not reorder loads with loads).
"""
from __future__ import annotations

import numba
import numpy as np

from . import kernel_cache

kernel_cache.install()  # before the first cached function: its stamp covers every file the kernels are built from

# LL128 intra-slice layout: 32 lanes x 8 words per "wire slice" (2048 B = 16 lines) carrying 240 data words
# (1920 B).  Lane w stores, for g = 0..3, the word pair at wire word g*64 + 2w; the flag lane (w % 8 == 7) stores
# only one data word there, its other word being the flag.  Data chunk (16 B) of lane w in group g is
# ix = g*32 - 4*(g//2) + w - (g%2)*(w//8) (``loadRegsBegin``); flag lanes load chunks only for even g and park
# the second half of that chunk in word 14 of their group-(g+1) line (``loadRegsFinish``).
def _ll128_perm() -> np.ndarray:
    perm = np.full(240, -1, np.int64)
    for w in range(32):
        flag_lane = w % 8 == 7
        for g in range(4):
            wire = g * 64 + 2 * w
            if not flag_lane:
                ix = g * 32 - 4 * (g // 2) + w - (g % 2) * (w // 8)
                perm[2 * ix], perm[2 * ix + 1] = wire, wire + 1
            elif g % 2 == 0:
                ix = g * 32 - 4 * (g // 2) + w
                perm[2 * ix] = wire                  # first half of the chunk beside the flag
                perm[2 * ix + 1] = wire + 64         # second half: word 14 of the next group's line
    assert sorted(perm.tolist()) == [i for i in range(256) if i % 16 != 15]
    return perm


LL128_PERM = _ll128_perm()          # data word j of a slice -> wire word
LL128_DATA_WORDS, LL128_WIRE_WORDS = 240, 256

_jit = numba.njit(nogil=True, cache=True)


@_jit
def ll_pack(dst, src, nlines, flag):
    """LL store: line i = {lo32(src[i]), flag, hi32(src[i]), flag} as two self-validating 8-byte words."""
    f = np.uint64(flag) << np.uint64(32)
    for i in range(nlines):
        v = src[i]
        dst[2 * i] = (v & np.uint64(0xFFFFFFFF)) | f
        dst[2 * i + 1] = (v >> np.uint64(32)) | f


@_jit
def ll_fill(dst, first, last, flag):
    """LL cleanup: lines [first, last) become {0, flag, 0, flag}."""
    f = np.uint64(flag) << np.uint64(32)
    for i in range(first, last):
        dst[2 * i] = f
        dst[2 * i + 1] = f


@_jit
def ll_poll_unpack(src, out, start, nlines, flag):
    """Accept lines from ``start`` while both flags equal ``flag``; returns how far it got."""
    f = np.uint64(flag)
    for i in range(start, nlines):
        w0 = src[2 * i]
        w1 = src[2 * i + 1]
        if (w0 >> np.uint64(32)) != f or (w1 >> np.uint64(32)) != f:
            return i
        out[i] = (w0 & np.uint64(0xFFFFFFFF)) | (w1 << np.uint64(32))
    return nlines


@_jit
def ll128_pack(wire, data, nslices, perm):
    for s in range(nslices):
        for j in range(240):
            wire[s * 256 + perm[j]] = data[s * 240 + j]


@_jit
def ll128_set_flags(wire, nlines, flag):
    for line in range(nlines):
        wire[line * 16 + 15] = flag


@_jit
def ll128_ready(wire, start, nlines, flag):
    """First line from ``start`` whose flag word is not ``flag`` (``nlines`` if all are current)."""
    for line in range(start, nlines):
        if wire[line * 16 + 15] != flag:
            return line
    return nlines


@_jit
def ll128_unpack(wire, data, first_slice, end_slice, perm):
    for s in range(first_slice, end_slice):
        for j in range(240):
            data[s * 240 + j] = wire[s * 256 + perm[j]]
