"""What a real NCCL INFO log says, as a short text: version, ranks, nodes, GPUs per node, channels and rings, the
transport of every edge, the TUNING choices, and anything unusual.  Reads only the log (``tracing.nccl_log``
plus the lines it does not keep); the tree replay and the diagrams are added by ``visualize.explain``.

Lines read, beyond ``nccl_log``'s: ``NCCL version 2.26.2+cuda12.2`` (``init.cc`` ``showVersion``), ``N coll
channels, N collnet channels, ...`` (``init.cc``, one per rank), and the TUNING decisions ``AllReduce: 65536 Bytes
-> Algo RING proto SIMPLE channel{Lo..Hi}={0..15}`` (``enqueue.cc``; ours print ``time`` instead of the channel
range).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .nccl_log import LogError, NcclLog, parse

_VERSION = re.compile(r"NCCL INFO NCCL version (\S+)")
_COLL_CH = re.compile(r"NCCL INFO (\d+) coll channels, (\d+) collnet channels, (\d+) nvls channels")
_CHOICE = re.compile(r"NCCL INFO (\w+):? (\d+) Bytes -> Algo (\S+) proto (\S+)")
_PID = re.compile(r"^\s*([^\s:]+):(\d+):\d+ \[\d+\] NCCL INFO")


@dataclass
class LogFacts:
    log: NcclLog
    text: str = ""                                        # the log without the lines that could not be read
    bad_lines: list = field(default_factory=list)         # (line number, why) of those lines
    versions: list = field(default_factory=list)
    coll_channels: dict = field(default_factory=dict)     # rank -> coll channels (init.cc's per-rank line)
    choices: list = field(default_factory=list)           # (func, bytes, algo, proto)
    tuning_table: bool = False
    ranks_seen: set = field(default_factory=set)
    info_lines: int = 0                                   # lines with NCCL's "NCCL INFO" marker


def is_nccl_log(facts: LogFacts) -> bool:
    """At least one ``NCCL INFO`` line, and one of the lines this module reads."""
    log = facts.log
    return facts.info_lines > 0 and bool(log.local_ranks or log.rings or log.trees or log.transports)


def _lenient_parse(text: str) -> tuple[NcclLog, str, list]:
    """``nccl_log.parse``, leaving out each line it cannot read (a log cut mid-line): the log, the text kept, and
    (line number, why) per line left out."""
    lines, bad = text.splitlines(), []
    while True:
        kept = "\n".join(line for i, line in enumerate(lines, 1) if i not in {n for n, _ in bad})
        try:
            return parse(kept), kept, bad
        except LogError as exc:
            m = re.match(r"line (\d+): (.*?):", str(exc))
            if not m or len(bad) >= 100:
                raise
            kept_numbers = [i for i in range(1, len(lines) + 1) if i not in {n for n, _ in bad}]
            bad.append((kept_numbers[int(m.group(1)) - 1], m.group(2)))


def read(text: str) -> LogFacts:
    """The facts of ``text``; never raises on partial or cut logs (unreadable lines are listed in ``bad_lines``)."""
    log, kept, bad = _lenient_parse(text)
    facts = LogFacts(log, kept, bad)
    rank_of_pid: dict[tuple, int] = {}
    for line in text.splitlines():
        if "NCCL INFO" not in line:
            continue
        facts.info_lines += 1
        pm = _PID.match(line)
        m = re.search(r"comm 0x[0-9a-f]+ rank (\d+) nRanks", line)
        if m and pm:
            rank_of_pid[(pm.group(1), pm.group(2))] = int(m.group(1))
        m = _VERSION.search(line)
        if m and m.group(1) not in facts.versions:
            facts.versions.append(m.group(1))
        m = _COLL_CH.search(line)
        if m and pm and (pm.group(1), pm.group(2)) in rank_of_pid:
            facts.coll_channels[rank_of_pid[(pm.group(1), pm.group(2))]] = int(m.group(1))
        m = _CHOICE.search(line)
        if m:
            facts.choices.append((m.group(1), int(m.group(2)), m.group(3), m.group(4)))
        if "NCCL INFO" in line and "Algorithm" in line and "|" in line:
            facts.tuning_table = True
    facts.ranks_seen = set(log.local_ranks) | {r for t in log.trees.values() for r in t}
    return facts


def _ranges(values: list[int]) -> str:
    values, out, i = sorted(set(values)), [], 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        out.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ",".join(out)


def unusual(facts: LogFacts) -> list[str]:
    """What a reader should notice: missing ranks, channel counts that differ between ranks, cut lines."""
    log, out = facts.log, []
    n = log.nranks
    if n:
        missing = sorted(set(range(n)) - facts.ranks_seen)
        if missing:
            out.append(f"ranks {_ranges(missing)} of {n} print no comm or Trees line (missing from the log, or "
                       f"the log was cut)")
    if log.trees:
        per_rank: dict[int, int] = {}
        for tree in log.trees.values():
            for r in tree:
                per_rank[r] = per_rank.get(r, 0) + 1
        counts = sorted(set(per_rank.values()))
        if len(counts) > 1:
            detail = "; ".join(f"{c} channels: ranks {_ranges([r for r, k in per_rank.items() if k == c])}"
                               for c in counts)
            out.append(f"the ranks print Trees for different channel counts ({detail})")
    if len(set(facts.coll_channels.values())) > 1:
        out.append("coll channel counts differ between ranks: " + ", ".join(
            f"rank {r}: {c}" for r, c in sorted(facts.coll_channels.items())))
    if log.ring_total and log.rings and len(log.rings) != log.ring_total:
        out.append(f"rank 0 prints {len(log.rings)} of its {log.ring_total} rings")
    if log.truncated_rings:
        out.append(f"ring lines of channels {_ranges(list(log.truncated_rings))} are cut with '...'")
    for c, ring in sorted(log.rings.items()):
        if n and c not in log.truncated_rings and sorted(ring) != list(range(n)):
            out.append(f"channel {c}'s ring is not a permutation of the {n} ranks: {ring}")
    if len(set(log.local_ranks.values())) > 1:
        out.append("nodes have different GPU counts (localRanks " + _ranges(list(log.local_ranks.values())) + ")")
    if len(facts.versions) > 1:
        out.append("several NCCL versions in one log: " + ", ".join(facts.versions))
    for lineno, why in facts.bad_lines[:5]:
        out.append(f"line {lineno} left out: {why}")
    return out


def nranks(facts: LogFacts) -> int:
    """The communicator's size: its ``nRanks``, else the highest rank any line names + 1 (0: none)."""
    log = facts.log
    named = facts.ranks_seen | {r for ring in log.rings.values() for r in ring} | {
        r for (_, a, b) in log.transports for r in (a, b)}
    return log.nranks or max(named, default=-1) + 1


def report(facts: LogFacts, name: str, node_of: list[int]) -> list[str]:
    """The text report, one fact per line; ``node_of``: each rank's node (``collectives.graph.replay.nodes_of``).
    The caller appends the replay of the trees and the diagrams."""
    log = facts.log
    n = nranks(facts)
    nnodes = log.nnodes or (max(node_of) + 1 if node_of else 0)
    per_node = sorted(set(log.local_ranks.values()))
    lines = [f"# {name}",
             f"NCCL version: {', '.join(facts.versions) if facts.versions else 'not in the log'}",
             f"ranks: {n}, nodes: {nnodes}, GPUs per node: {_ranges(per_node) if per_node else 'unknown'}"
             + (f" (hosts {', '.join(sorted(set(log.host_of.values())))})" if log.host_of else "")]
    if node_of:
        lines.append("ranks by node: " + "; ".join(f"node {k}: {_ranges([r for r in range(n) if node_of[r] == k])}"
                                                   for k in range(max(node_of) + 1)))
    nch = log.ring_total or len(log.rings) or len(log.trees)
    lines.append(f"channels: {nch}" + (f" (coll channels per rank: {_ranges(list(facts.coll_channels.values()))})"
                                       if facts.coll_channels else ""))
    if log.rings:
        distinct: dict[tuple, list[int]] = {}
        for c, ring in sorted(log.rings.items()):
            distinct.setdefault(tuple(ring), []).append(c)
        lines.append(f"rings ({len(distinct)} distinct, rank 0's Channel lines):")
        for ring, chans in distinct.items():
            lines.append(f"  channels {_ranges(chans)}: {' '.join(map(str, ring))}")
    else:
        lines.append("rings: no 'Channel NN/MM :' lines (rank 0 prints them at INIT)")
    if log.transports:
        kinds: dict[str, int] = {}
        edges: dict[tuple, dict[str, list[int]]] = {}
        for (c, a, b), via in log.transports.items():
            kinds[via] = kinds.get(via, 0) + 1
            edges.setdefault((a, b), {}).setdefault(via, []).append(c)
        lines.append(f"transports ({len(log.transports)} channel edges): "
                     + ", ".join(f"{v} x{k}" for v, k in sorted(kinds.items())))
        for (a, b), vias in sorted(edges.items()):
            where = "inter-node" if node_of and max(a, b) < len(node_of) and node_of[a] != node_of[b] else \
                "intra-node"
            lines.append(f"  {a} -> {b} ({where}): " + "; ".join(f"{v} on channels {_ranges(cs)}"
                                                                 for v, cs in sorted(vias.items())))
    else:
        lines.append("transports: no 'Channel NN : a[d] -> b[d] via ...' lines (NCCL prints them at INIT)")
    if facts.choices or facts.tuning_table:
        lines.append(f"TUNING: {'the algorithm/protocol table is printed; ' if facts.tuning_table else ''}"
                     f"{len(facts.choices)} choice(s)")
        seen = set()
        for func, size, algo, proto in facts.choices:
            if (func, size) not in seen:
                seen.add((func, size))
                lines.append(f"  {func} {size} B -> {algo}/{proto}")
    else:
        lines.append("TUNING: none (NCCL_DEBUG_SUBSYS=TUNING prints the choices)")
    return lines
