"""Which protocols (and algorithms) a collective may use, and with how many threads (NCCL ``src/graph/tuning.cc``:
``parseList``, ``getNthreads``, the ``NCCL_PROTO`` / ``NCCL_ALGO`` and ``maxThreads`` parts of ``ncclTopoTuneModel``).

Grammar, as ``parseList``: entries separated by ``;``; each is ``[func:]list``, only the first may omit the
``func:`` prefix (it then applies to every function); ``list`` is a comma list, a leading ``^`` disables the listed
names and enables the rest; an entry with a prefix replaces that function's whole row; names are case-insensitive;
an unknown name or prefix is an error.  E.g. ``NCCL_PROTO="^LL128;allreduce:LL128"``.
The choice among what is enabled is the cost model's (``cost_model.py``).
"""
from __future__ import annotations

import os

import numpy as np

from collectives.include.device import (FUNCS, NCCL_LL128_MAX_NTHREADS, NCCL_LL_MAX_NTHREADS, NCCL_MAX_NTHREADS,
                                        NCCL_SIMPLE_MAX_NTHREADS, WARP_SIZE)
from collectives.include.protocols import PROTOS
from collectives.misc.param import env_int
from tracing import debug

ALGOS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")


class TuningError(ValueError):
    """A bad NCCL_PROTO / NCCL_ALGO value, or one that leaves a collective nothing to run."""


def _strtok(text: str, delims: str) -> list[tuple[int, str]]:
    """C's ``strtok``: the non-empty runs between delimiter characters, with their offsets (no stripping)."""
    out, i = [], 0
    while i < len(text):
        while i < len(text) and text[i] in delims:
            i += 1
        j = i
        while j < len(text) and text[j] not in delims:
            j += 1
        if j > i:
            out.append((i, text[i:j]))
        i = j
    return out


def parse_list(text: str, elems: tuple, what: str, prefixes: tuple = FUNCS,
               initial: dict | None = None) -> dict[str, dict[str, object]]:
    """``parseList``: {func: {elem: value}}.  Rows start from ``initial`` (default: everything True); an entry
    rewrites whole rows to True/False, and rows it does not name keep their initial value (for ``NCCL_PROTO``,
    LL128's "automatic" 2).  Tokens are split as ``strtok`` splits them and never stripped: ``"LL, Simple"`` names
    the element ``" Simple"``, which NCCL rejects."""
    table = {p: dict(initial) if initial else {e: True for e in elems} for p in prefixes}
    for offset, entry in _strtok(text, ";"):
        parts = _strtok(entry, ":")
        if len(parts) < 2:
            if offset != 0:
                raise TuningError(f"All entries except the first must have a prefix: \"{text}\"")
            prefix, items = None, parts[0][1]
        else:
            prefix, items = parts[0][1], parts[1][1]
        negate = items.startswith("^")
        items = items[1:] if negate else items
        rows = [p for p in prefixes if prefix is None or p.lower() == prefix.lower()]
        if not rows:
            raise TuningError(f"{what}={text!r}: unrecognized prefix {prefix!r} (functions: {', '.join(prefixes)})")
        names = [tok for _, tok in _strtok(items, ",")]
        for name in names:
            if name.lower() not in (e.lower() for e in elems):
                raise TuningError(f"{what}={text!r}: unrecognized element {name!r} (choose from {', '.join(elems)})")
        chosen = {e for e in elems if e.lower() in (n.lower() for n in names)}
        for p in rows:
            table[p] = {e: (e not in chosen) if negate else (e in chosen) for e in elems}
    return table


PCI_BW = 12.0  # GB/s, PCI Gen3 x16 (src/graph/topo.h)


def get_nthreads(name: str, env: int, lo: int, hi: int, default: int) -> int:
    """``getNthreads``: a positive ``NCCL_NTHREADS`` / ``NCCL_LL128_NTHREADS`` that is not a multiple of 32 falls
    back to the maximum, one above the maximum is clamped to it, one below the minimum raised to it, each with
    NCCL's INFO line (GRAPH|ENV); zero, negative or unset gives ``default``."""
    if env <= 0:
        return default
    if env % WARP_SIZE:
        debug.info("GRAPH|ENV", f"Invalid {name} {env} (must be a multiple of {WARP_SIZE})")
        return hi
    if env > hi:
        debug.info("GRAPH|ENV", f"Invalid {name} {env} (maximum {hi}).")
        return hi
    if env < lo:
        debug.info("GRAPH|ENV", f"Invalid {name} {env} (minimum {lo}).")
        return lo
    return env


def max_threads(ring_bw_intra: float, ring_nchannels: int) -> dict[tuple[str, str], int]:
    """``comm->maxThreads[algo][proto]`` as ``ncclTopoTuneModel`` sets it.  Ring/Simple defaults to 256 threads
    when the ring graph's ``bwIntra * nChannels`` is at most ``PCI_BW`` (a slow, PCI-class ring), else 512; the
    other rows default to their maxima.  ``NCCL_NTHREADS`` / ``NCCL_LL128_NTHREADS`` go through ``get_nthreads``.
    CollNet and NVLS get ``NCCL_MAX_NTHREADS`` for Simple; rows NCCL never sets stay 0 (PAT's, LL/LL128 of the
    others), as its zeroed communicator leaves them."""
    nt_env = env_int("NCCL_NTHREADS", -2)
    ll128_env = env_int("NCCL_LL128_NTHREADS", -2)
    f32 = float(np.float32(np.float32(ring_bw_intra) * ring_nchannels))  # float * int in NCCL
    simple_default = 256 if f32 <= PCI_BW else NCCL_SIMPLE_MAX_NTHREADS
    out = {(a, p): 0 for a in ALGOS for p in PROTOS}
    out[("Ring", "Simple")] = get_nthreads("NCCL_NTHREADS", nt_env, 2 * WARP_SIZE, NCCL_SIMPLE_MAX_NTHREADS,
                                           simple_default)
    out[("Tree", "Simple")] = get_nthreads("NCCL_NTHREADS", nt_env, 2 * WARP_SIZE, NCCL_SIMPLE_MAX_NTHREADS,
                                           NCCL_SIMPLE_MAX_NTHREADS)
    for a in ("CollNetDirect", "CollNetChain", "NVLS", "NVLSTree"):
        out[(a, "Simple")] = NCCL_MAX_NTHREADS
    out[("Ring", "LL")] = out[("Tree", "LL")] = get_nthreads("NCCL_NTHREADS", nt_env, 2 * WARP_SIZE,
                                                             NCCL_LL_MAX_NTHREADS, NCCL_LL_MAX_NTHREADS)
    out[("Ring", "LL128")] = out[("Tree", "LL128")] = get_nthreads("NCCL_LL128_NTHREADS", ll128_env,
                                                                   NCCL_LL128_MAX_NTHREADS // 4, NCCL_LL128_MAX_NTHREADS,
                                                                   NCCL_LL128_MAX_NTHREADS)
    return out


def protocol_table(text: str | None = None) -> dict[str, dict[str, bool]]:
    return _table("NCCL_PROTO", text, PROTOS)


def algorithm_table(text: str | None = None) -> dict[str, dict[str, bool]]:
    return _table("NCCL_ALGO", text, ALGOS)


def _table(var: str, text: str | None, elems: tuple) -> dict[str, dict[str, bool]]:
    env = os.environ.get(var)
    if env is not None and (text is None or text == env):
        debug.info("ENV", f"{var} set by environment to {env}")  # ncclTopoTuneModel, every rank
    return parse_list((env or "") if text is None else text, elems, var)
