"""Environment parameters, NCCL style (``src/misc/param.cc``: ``NCCL_PARAM`` / ``ncclGetEnv``).

NCCL reads each ``NCCL_*`` variable once and treats ``-2`` as "unset, use the default".  Our own knobs use
the ``NCCLLAB_`` prefix.  ``check_env`` reads the lab's own numeric knobs once before any rank starts, so that a
bad value is one line at the command line instead of an error from deep inside every rank.
"""
from __future__ import annotations

import math
import os

from tracing import debug

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_WARN_AFTER_S = 5.0


def strtoll(text: str) -> tuple[int, bool]:
    """C's ``strtoll(text, NULL, 0)``: leading blanks and a sign, then ``0x`` hex, ``0`` octal or decimal digits,
    stopping at the first character that does not fit (``"12abc"`` is 12, ``"abc"`` is 0, ``"010"`` is 8).
    Returns (value, overflowed); on overflow the value is clamped as C does and ``errno`` would be ERANGE."""
    s = text.lstrip(" \t\n\v\f\r")
    sign = 1
    if s[:1] in ("+", "-"):
        sign, s = (-1 if s[0] == "-" else 1), s[1:]
    base = 10
    if s[:2].lower() == "0x" and len(s) > 2 and s[2] in "0123456789abcdefABCDEF":
        base, s = 16, s[2:]
    elif s[:1] == "0":
        base = 8
    digits = "0123456789abcdef"[:base]
    n = 0
    while n < len(s) and s[n].lower() in digits:
        n += 1
    value = sign * int(s[:n], base) if n else 0
    lo, hi = -(1 << 63), (1 << 63) - 1
    if value > hi or value < lo:
        return (hi if value > hi else lo), True
    return value, False


def env_int(name: str, default: int) -> int:
    """``ncclLoadParam``: an integer variable read as ``strtoll(str, NULL, 0)`` reads it, so ``010`` is octal and
    ``12abc`` is 12; unset or empty gives ``default``; an out-of-range value falls back to ``default`` with NCCL's
    INFO line (NCCL_ALL).  ``-2`` is NCCL's "unset" value and also gives ``default`` (``NCCL_PARAM``'s convention,
    which NCCL applies at each use site)."""
    raw = os.environ.get(name, "")
    if not raw:
        return default
    value, overflow = strtoll(raw)
    ours = name.startswith("NCCLLAB_")  # NCCL logs its own parameters; our knobs stay quiet
    if overflow:
        if not ours:
            log_once("ALL", f"Invalid value {raw} for {name}, using default {default}.")
        return default
    if not ours:
        log_once("ENV", f"{name} set by environment to {value}.")
    return default if value == -2 else value


_logged: set = set()
os.register_at_fork(after_in_child=_logged.clear)  # a forked rank logs its variables, as a new process would


def log_once(subsys: str, msg: str) -> None:
    """Once per distinct line, as NCCL caches each parameter after its first read."""
    if msg in _logged:
        return
    _logged.add(msg)
    debug.info(subsys, msg)


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def _seconds(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value < math.inf:  # nan fails both comparisons; inf would be NCCL's wait forever, which we never do
        raise ValueError(f"{name}={raw!r} must be a positive number of seconds")
    return value


def timeout_s() -> float:
    """Deadline for every wait (``NCCLLAB_TIMEOUT`` seconds).  NCCL itself waits forever; we never do."""
    return _seconds("NCCLLAB_TIMEOUT", DEFAULT_TIMEOUT_S)


def warn_after_s() -> float:
    """A wait without progress for this long prints one WARN line naming what it waits for
    (``NCCLLAB_WARN_AFTER`` seconds, default 5)."""
    return _seconds("NCCLLAB_WARN_AFTER", DEFAULT_WARN_AFTER_S)


def handshake_timeout_s() -> float:
    """How long a new connection may take to send its handshake before a listener drops it
    (``NCCLLAB_HANDSHAKE_TIMEOUT`` seconds, default 1; ``misc.listener``)."""
    return _seconds("NCCLLAB_HANDSHAKE_TIMEOUT", 1.0)


def check_env() -> str | None:
    """Each of the lab's seconds knobs read as the ranks will read it: the first bad one's line (``NCCLLAB_TIMEOUT='0'
    must be a positive number of seconds``), or None.  The entry points call it before starting ranks."""
    for read in (timeout_s, warn_after_s, handshake_timeout_s):
        try:
            read()
        except ValueError as exc:
            return str(exc)
    return None
