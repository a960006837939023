"""Sleeping on a step counter: Linux futexes on the low 32 bits of a head or tail word in shared memory.

Deliberate difference from NCCL, whose GPU threads only spin: with 8 ranks on 2 cores a spinning rank steals the
core its peer needs, so after a short spin a waiting rank marks the counter's line "sleeping" and blocks in
``FUTEX_WAIT``; the poster, after storing the counter, wakes it if the mark is set.  Python cannot issue the fence
that would close the store/load race between the two sides, so every sleep is bounded (``SLEEP_NS``) and a missed
wake costs at most that.
"""
from __future__ import annotations

import ctypes
import os
import platform

SLEEP_NS = 200_000
SYS_FUTEX = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
FUTEX_WAIT, FUTEX_WAKE = 0, 1
WAKE_ALL = 0x7FFFFFFF  # FUTEX_WAKE's count: every waiter
_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_TS = _Timespec(0, SLEEP_NS)
AVAILABLE = SYS_FUTEX is not None and os.environ.get("NCCLLAB_FUTEX", "1") != "0"


def address(word) -> int:
    """Where an array's data starts: host memory, or device memory for a CUDA array (cupy, torch)."""
    face = getattr(word, "__cuda_array_interface__", None) or word.__array_interface__
    return face["data"][0]


def wait(addr: int, expected_low32: int) -> None:
    """Block while the 32-bit word at ``addr`` equals ``expected_low32``, for at most SLEEP_NS."""
    _syscall(SYS_FUTEX, ctypes.c_void_p(addr), FUTEX_WAIT, ctypes.c_uint32(expected_low32), ctypes.byref(_TS),
             None, 0)


def wake(addr: int) -> None:
    _syscall(SYS_FUTEX, ctypes.c_void_p(addr), FUTEX_WAKE, WAKE_ALL, None, None, 0)
