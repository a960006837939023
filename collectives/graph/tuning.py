"""Which protocols (and algorithms) a collective may use (NCCL ``src/graph/tuning.cc``: ``parseList``,
the ``NCCL_PROTO`` / ``NCCL_ALGO`` part of ``ncclTopoTuneModel``).

Grammar, as ``parseList``: entries separated by ``;``; each is ``[func:]list``, only the first may omit the
``func:`` prefix (it then applies to every function); ``list`` is a comma list, a leading ``^`` disables the listed
names and enables the rest; an entry with a prefix replaces that function's whole row; names are case-insensitive;
an unknown name or prefix is an error.  E.g. ``NCCL_PROTO="^LL128;allreduce:LL128"``.
The choice among what is enabled is the cost model's (``cost_model.py``).
"""
from __future__ import annotations

from collectives.param import env_str

FUNCS = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
PROTOS = ("LL", "LL128", "Simple")
ALGOS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")


class TuningError(ValueError):
    """A bad NCCL_PROTO / NCCL_ALGO value, or one that leaves a collective nothing to run."""


def parse_list(text: str, elems: tuple, what: str, prefixes: tuple = FUNCS) -> dict[str, dict[str, bool]]:
    """``parseList``: {func: {elem: enabled}}; everything enabled when ``text`` is empty."""
    table = {p: {e: True for e in elems} for p in prefixes}
    if not text.strip():
        return table
    for k, entry in enumerate(text.split(";")):
        entry = entry.strip()
        if not entry:
            continue
        prefix, sep, items = entry.partition(":")
        if not sep:
            if k != 0:
                raise TuningError(f"{what}={text!r}: all entries except the first must have a prefix")
            prefix, items = None, entry
        negate = items.startswith("^")
        items = items[1:] if negate else items
        rows = [p for p in prefixes if prefix is None or p.lower() == prefix.strip().lower()]
        if not rows:
            raise TuningError(f"{what}={text!r}: unrecognized prefix {prefix!r} (functions: {', '.join(prefixes)})")
        names = [x.strip() for x in items.split(",") if x.strip()]
        for name in names:
            if name.lower() not in (e.lower() for e in elems):
                raise TuningError(f"{what}={text!r}: unrecognized element {name!r} (choose from {', '.join(elems)})")
        chosen = {e for e in elems if e.lower() in (n.lower() for n in names)}
        for p in rows:
            table[p] = {e: (e not in chosen) if negate else (e in chosen) for e in elems}
    return table


def protocol_table(text: str | None = None) -> dict[str, dict[str, bool]]:
    return parse_list(env_str("NCCL_PROTO") if text is None else text, PROTOS, "NCCL_PROTO")


def algorithm_table(text: str | None = None) -> dict[str, dict[str, bool]]:
    return parse_list(env_str("NCCL_ALGO") if text is None else text, ALGOS, "NCCL_ALGO")
