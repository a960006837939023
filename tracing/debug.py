"""NCCL_DEBUG logging in NCCL's line formats (``src/debug.cc``: ``ncclDebugLog``).

``NCCL_DEBUG`` = VERSION | WARN | INFO | TRACE; ``NCCL_DEBUG_SUBSYS`` a comma list (``^`` negates; default
``INIT,BOOTSTRAP,ENV``); ``NCCL_DEBUG_FILE`` may contain ``%h`` (host) and ``%p`` (pid).
INFO lines read ``host:pid:tid [dev] NCCL INFO msg``; WARN lines start with NCCL's newline and timestamp
(``NCCL_DEBUG_TIMESTAMP_FORMAT``, default ``[%F %T] ``) and add ``file:line (func)``.  A line's subsystem may
have several bits, as NCCL's flags do: ``info("INIT|SHM", ...)`` prints when either is selected.
Here ``dev`` is the local rank: a CPU rank has no CUDA device, so its index on the host stands in for it.
"""
from __future__ import annotations

import inspect
import os
import socket
import sys
import threading
import time
from typing import TextIO

LEVELS = {"NONE": 0, "VERSION": 1, "WARN": 2, "INFO": 3, "ABORT": 4, "TRACE": 5}
SUBSYS = ("INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV", "ALLOC", "CALL", "PROXY", "NVLS",
          "BOOTSTRAP", "REG", "PROFILE", "RAS", "DESTROY")

_state: dict = {}
_lock = threading.Lock()


def _init() -> dict:
    if _state:
        return _state
    level = LEVELS.get(os.environ.get("NCCL_DEBUG", "").strip().upper(), 0)
    raw = os.environ.get("NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,ENV").strip().upper()
    invert = raw.startswith("^")
    names = {s.strip() for s in raw.lstrip("^").split(",") if s.strip()}
    if "ALL" in names:
        names = set(SUBSYS)
    mask = set(SUBSYS) - names if invert else names
    out: TextIO | None = None  # None: whatever sys.stdout is when a line is written
    path = os.environ.get("NCCL_DEBUG_FILE", "").strip()
    host = socket.gethostname().split(".")[0]
    if path and level:
        path = path.replace("%h", host).replace("%p", str(os.getpid()))
        out = open(path, "a", buffering=1)
    _state.update(level=level, mask=mask, out=out, host=host, dev=0, t0=time.monotonic())
    return _state


def reset() -> None:
    """Read the environment again at the next line (``ncclResetDebugInit``)."""
    with _lock:
        out = _state.get("out")
        if out is not None:  # only NCCL_DEBUG_FILE is ours to close, never a standard stream
            out.close()
        _state.clear()


def _forget_after_fork() -> None:
    """A forked child (``collectives.misc.forked``'s ranks) reads its own environment at its first line, as a new
    process does; its parent's ``NCCL_DEBUG_FILE`` object is kept, not closed: it is the parent's file."""
    _inherited.append(_state.get("out"))
    _state.clear()


_inherited: list = []
os.register_at_fork(after_in_child=_forget_after_fork)


def set_device(dev: int) -> None:
    """Record the local rank printed in ``[dev]``."""
    _init()["dev"] = dev


def enabled(level: str, subsys: str = "INIT") -> bool:
    """``subsys`` is one name or several joined by ``|`` (NCCL's flag bits); ``ALL`` matches any selection."""
    st = _init()
    if st["level"] < LEVELS[level]:
        return False
    if level == "WARN":
        return True
    bits = subsys.split("|")
    return "ALL" in bits or any(b in st["mask"] for b in bits)


def _prefix() -> str:
    st = _init()
    return f"{st['host']}:{os.getpid()}:{threading.get_native_id()} [{st['dev']}]"


def _emit(line: str) -> None:
    with _lock:
        st = _init()
        out = st["out"] or sys.stdout
        out.write(line + "\n")
        out.flush()


def info(subsys: str, msg: str) -> None:
    if enabled("INFO", subsys):
        _emit(f"{_prefix()} NCCL INFO {msg}")


def warn(msg: str) -> None:
    """WARN is printed at NCCL_DEBUG=WARN or above, with the caller's file, line and function like NCCL."""
    if enabled("WARN"):
        frame = inspect.stack()[1]
        where = f"{os.path.basename(frame.filename)}:{frame.lineno} ({frame.function})"
        _emit(f"\n{_timestamp()}{_prefix()} {where} NCCL WARN {msg}")


def _timestamp() -> str:
    """NCCL_DEBUG_TIMESTAMP_FORMAT (strftime, ``_`` for spaces) on WARN lines, NCCL's default levels."""
    fmt = os.environ.get("NCCL_DEBUG_TIMESTAMP_FORMAT", "[%F %T] ").replace("_", " ")
    return time.strftime(fmt)


def trace(subsys: str, msg: str) -> None:
    if enabled("TRACE", subsys):
        ms = (time.monotonic() - _init()["t0"]) * 1000.0
        frame = inspect.stack()[1]
        _emit(f"{_prefix()} {ms:.6f} {frame.function}:{frame.lineno} NCCL TRACE {msg}")


def ranges(values, sep: str = ",") -> str:
    """Ranks (or channels) as runs: ``[3, 4, 5, 9]`` is ``3-5,9``, so a list stays one short line at any scale."""
    values, out, i = sorted(set(values)), [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return sep.join(out)
