"""Parser of nccl-tests output (``all_reduce_perf`` & co.), both row formats (NCCL_FACTS §8.2).

Reads legacy (<= 2.17: ``%7.2f`` times, ``%5g`` #wrong) and current (>= 2.18: ``getFloatStr``) rows, older rows
without the ``root`` column and with an ``error`` column (``0e+00``), any header or comment lines, several tables
in one file, and the ``Out of bounds values`` / ``Avg bus bandwidth`` footers.
Works on real nccl-tests output and on ``python -m collectives.ring``'s, which prints the same table.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_NUM = re.compile(r"^-?[\d.]+(e[-+]?\d+)?$|^N/A$", re.I)


@dataclass
class Row:
    size: int
    count: int
    dtype: str
    op: str
    root: int
    out_of_place: dict
    in_place: dict


@dataclass
class Table:
    rows: list = field(default_factory=list)
    out_of_bounds: int | None = None
    oob_ok: bool | None = None
    avg_busbw: float | None = None
    header: list = field(default_factory=list)


def _num(text: str):
    if text == "N/A":
        return None
    return float(text)


def _placement(fields: list[str]) -> dict:
    time, algbw, busbw, wrong = fields
    return {"time_us": float(time), "algbw": float(algbw), "busbw": float(busbw), "wrong": _num(wrong)}


def _row(tok: list[str]) -> Row | None:
    """size count type redop [root] then 4 numbers per placement; None for anything else."""
    if len(tok) not in (12, 13) or not (tok[0].isdigit() and tok[1].isdigit()):
        return None
    root = int(tok[4]) if len(tok) == 13 and tok[4].lstrip("-").isdigit() else -1
    nums = tok[-8:]
    if not all(_NUM.match(x) for x in nums):
        return None
    return Row(int(tok[0]), int(tok[1]), tok[2], tok[3], root, _placement(nums[:4]), _placement(nums[4:]))


def parse(text: str) -> list[Table]:
    """All tables in ``text``; a new table starts at each header after a footer (or at the first row)."""
    tables: list[Table] = []
    cur: Table | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            m = re.match(r"Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)", body)
            if m and cur is not None:
                cur.out_of_bounds, cur.oob_ok = int(m.group(1)), m.group(2) == "OK"
                continue
            m = re.match(r"Avg bus bandwidth\s*:\s*([-\d.eE+]+)", body)
            if m and cur is not None:
                cur.avg_busbw = float(m.group(1))
                cur = None  # table closed
                continue
            if cur is None:
                tables.append(Table())
                cur = tables[-1]
            cur.header.append(line)
            continue
        row = _row(line.split())
        if row is None:
            continue
        if cur is None:
            tables.append(Table())
            cur = tables[-1]
        cur.rows.append(row)
    return [t for t in tables if t.rows]
