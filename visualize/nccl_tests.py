"""Parser of nccl-tests output (``all_reduce_perf`` & co.), both row formats (nccl-tests ``src/common.cu``: ``printHeader``, ``BenchTime``).

Reads legacy (<= 2.17: ``%7.2f`` times, ``%5g`` #wrong) and current (>= 2.18: ``getFloatStr``) rows, older rows
without the ``root`` column and with an ``error`` column (``0e+00``), ``N/A`` for ``#wrong``, any header or comment
lines, several tables in one file, and the ``Out of bounds values`` / ``Avg bus bandwidth`` footers.
Output as users paste it: launcher prefixes on every line (``srun --label``'s ``0: ``, Open MPI's
``[1,0]<stdout>:``; each prefix is its own stream), ``NCCL INFO``/``WARN`` lines in between, a paste that starts at
``# Using devices`` or at the first row, and two processes' tables interleaved line by line (a row whose size does
not grow belongs to the other table).  The ``Rank … on host`` lines give the hosts, so ``nodes x ranks per node``.
Works on real nccl-tests output and on ``python -m collectives.ring``'s, which prints the same table.

Cost: ``parse_file`` streams a file line by line (each read up to ``tracing.nccl_log.MAX_LINE`` characters;
nccl-tests' are about 130); each row is offered to at most ``MAX_LANES`` tables running alongside per stream (the
oldest is closed when another opens: there were as many open tables as size restarts, each scanned per row); and
an input of more than ``MAX_ROWS`` rows is refused (``OutputError``): what is kept is the rows, so memory is
bounded by that.
"""
from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

from tracing.nccl_log import bounded_lines  # each line read up to its MAX_LINE characters

MAX_LANES = 8          # tables of one stream taking rows at once (processes printing the same table interleaved)
MAX_ROWS = 1 << 16     # rows of one input: nccl-tests' -b 1 -e 16G -f 2 is 35 per table
MAX_HEADER = 256       # header lines kept per table

_NUM = re.compile(r"^-?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?$|^N/A$", re.I | re.A)
_INT = re.compile(r"^\d+$", re.A)
# srun --label "12: ", Open MPI --tag-output "[1,0]<stdout>:", mpirun -prepend-rank "[0] "
_PREFIX = re.compile(r"^\s*(\d+: |\[\d+,\d+\]<std(?:out|err)>:\s?|\[\d+\] )")
_RANK_HOST = re.compile(r"#\s*Rank\s+(\d+)\s+Group\s+\d+\s+Pid\s+\d+\s+on\s+(\S+)")


class OutputError(ValueError):
    """Input the nccl-tests parser refuses (too large); the message says why, in one line."""


@dataclass(slots=True)
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
    hosts: dict = field(default_factory=dict)     # rank -> host, from the "# Rank ... on host" lines

    @property
    def shape(self) -> tuple[int, int] | None:
        """(nodes, ranks per node) when the ``Rank … on host`` lines were there."""
        if not self.hosts:
            return None
        nodes = len(set(self.hosts.values()))
        return nodes, len(self.hosts) // nodes


def _num(text: str):
    if text.upper() == "N/A":
        return None
    return float(text)


def _placement(fields: list[str]) -> dict:
    time, algbw, busbw, wrong = fields
    return {"time_us": _num(time), "algbw": _num(algbw), "busbw": _num(busbw), "wrong": _num(wrong)}


def _row(tok: list[str]) -> Row | None:
    """size count type redop [root] then 4 numbers per placement; None for anything else."""
    if len(tok) not in (12, 13) or not (_INT.match(tok[0]) and _INT.match(tok[1])):
        return None
    root = int(tok[4]) if len(tok) == 13 and _INT.match(tok[4].lstrip("-")) else -1
    nums = tok[-8:]
    if not all(_NUM.match(x) for x in nums):
        return None
    return Row(int(tok[0]), int(tok[1]), tok[2], tok[3], root, _placement(nums[:4]), _placement(nums[4:]))


def _split_prefix(line: str) -> tuple[str, str]:
    m = _PREFIX.match(line)
    return (m.group(1).strip(), line[m.end():]) if m else ("", line)


def parse(text: str) -> list[Table]:
    """All tables in ``text`` (see ``parse_lines``)."""
    return parse_lines(bounded_lines(io.StringIO(text, newline=None)))


def parse_file(path: str) -> list[Table]:
    """All tables of a file, streamed (see ``parse_lines``)."""
    with open(path, errors="replace") as f:
        try:
            return parse_lines(bounded_lines(f))
        except OutputError as exc:
            raise OutputError(f"{path}: {exc}") from None


def parse_lines(lines) -> list[Table]:
    """All tables in ``lines``, in order of their first line.  Per stream (launcher prefix), a new table starts at
    a header after a footer (or at the first row); rows whose size does not grow go to a second table that runs
    alongside (another process printing the same table)."""
    tables: list[Table] = []
    open_tables: dict[str, list[Table]] = {}   # stream -> tables still taking rows (first: the one taking headers)
    hosts: dict[str, dict] = {}                # stream -> rank -> host seen in its headers
    nrows = 0
    for raw in lines:
        stream, line = _split_prefix(raw.rstrip("\r\n"))
        if " NCCL INFO " in line or " NCCL WARN " in line or " NCCL TRACE " in line:
            continue
        lanes = open_tables.setdefault(stream, [])
        stripped = line.strip()
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            m = re.match(r"Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)", body)
            if m:
                for t in lanes:
                    if t.out_of_bounds is None:
                        t.out_of_bounds, t.oob_ok = int(m.group(1)), m.group(2) == "OK"
                        break
                continue
            m = re.match(r"Avg bus bandwidth\s*:\s*(\S+)", body)
            if m:
                if lanes:
                    value = m.group(1)
                    lanes.pop(0).avg_busbw = _num(value) if _NUM.match(value) else None
                continue
            if not lanes or lanes[0].rows:
                lanes.clear()                         # a header after rows: the previous table ended unfooted
                lanes.append(Table())
                tables.append(lanes[0])
                hosts[stream] = {}
            m = _RANK_HOST.match(stripped)
            if m:
                hosts[stream][int(m.group(1))] = m.group(2)
            if len(lanes[0].header) < MAX_HEADER:
                lanes[0].header.append(line)
            continue
        row = _row(line.split())
        if row is None:
            continue
        target = next((t for t in lanes if not t.rows or t.rows[-1].size < row.size), None)
        if target is None:
            target = Table(header=list(lanes[0].header) if lanes else [])
            if len(lanes) == MAX_LANES:
                lanes.pop(1 if MAX_LANES > 1 else 0)   # the oldest lane after the one taking headers
            lanes.append(target)
            tables.append(target)
        nrows += 1
        if nrows > MAX_ROWS:
            raise OutputError(f"more than {MAX_ROWS} nccl-tests rows (a sweep prints tens per table); split the "
                              f"input")
        target.rows.append(row)
        target.hosts = target.hosts or dict(hosts.get(stream, {}))
    return [t for t in tables if t.rows]
