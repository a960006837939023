"""Environment parameters, NCCL style (``src/misc/param.cc``: ``NCCL_PARAM`` / ``ncclGetEnv``).

NCCL reads each ``NCCL_*`` variable once and treats ``-2`` as "unset, use the default".  Our own knobs use
the ``NCCLLAB_`` prefix.
"""
from __future__ import annotations

import os

NCCL_STEPS = 8
MAXCHANNELS = 64
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_WARN_AFTER_S = 5.0


def env_int(name: str, default: int) -> int:
    """Integer env var; unset, empty or -2 gives ``default`` (NCCL's ``NCCL_PARAM`` convention)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw, 0)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r} is not an integer") from exc
    return default if value == -2 else value


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
    if value <= 0:
        raise ValueError(f"{name}={raw!r} must be a positive number of seconds")
    return value


def timeout_s() -> float:
    """Deadline for every wait (``NCCLLAB_TIMEOUT`` seconds).  NCCL itself waits forever; we never do."""
    return _seconds("NCCLLAB_TIMEOUT", DEFAULT_TIMEOUT_S)


def warn_after_s() -> float:
    """A wait without progress for this long prints one WARN line naming what it waits for
    (``NCCLLAB_WARN_AFTER`` seconds, default 5)."""
    return _seconds("NCCLLAB_WARN_AFTER", DEFAULT_WARN_AFTER_S)
