"""What a real NCCL INFO log says, as a short text: version, ranks, nodes, GPUs per node, channels and rings, the
transport of every edge, the TUNING choices, and anything unusual.  Reads only the log (``tracing.nccl_log``
plus the lines it does not keep); the tree replay and the diagrams are added by ``visualize.explain``.

Lines read, beyond ``nccl_log``'s: ``NCCL version 2.26.2+cuda12.2`` (``init.cc`` ``showVersion``), ``N coll
channels, N collnet channels, ...`` (``init.cc``, one per rank), and the TUNING decisions ``AllReduce: 65536 Bytes
-> Algo RING proto SIMPLE channel{Lo..Hi}={0..15}`` (``enqueue.cc``; ours print ``time`` instead of the channel
range).  The file is streamed once by ``nccl_log.parse_file`` (these lines are seen through its ``on_info``), so
neither time nor memory grows beyond the file's length and the log's own facts.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .debug import ranges
from .nccl_log import NcclLog, parse, parse_file
from .nccl_log import is_nccl_log as is_log

_COLL_CH = re.compile(r"(\d+) coll channels, (\d+) collnet channels, (\d+) nvls channels")
_CHOICE = re.compile(r"(\w+):? (\d+) Bytes -> Algo (\S+) proto (\S+)")
_RANK = re.compile(r"comm 0x[0-9a-f]+ rank (\d+) nRanks")
MAX_CHOICES = 4096          # TUNING lines kept (one per call and size; the report lists each size once)


@dataclass
class LogFacts:
    log: NcclLog
    bad_lines: list = field(default_factory=list)         # (line number, why) of the entries left out
    versions: list = field(default_factory=list)
    coll_channels: dict = field(default_factory=dict)     # rank -> coll channels (init.cc's per-rank line)
    choices: list = field(default_factory=list)           # (func, bytes, algo, proto)
    tuning_table: bool = False
    ranks_seen: set = field(default_factory=set)
    info_lines: int = 0                                   # lines with NCCL's "NCCL INFO" marker
    choice_count: int = 0                                 # TUNING choice lines (choices keeps the first MAX_CHOICES)
    bad_count: int = 0                                    # entries left out (bad_lines lists the first ones)


def is_nccl_log(facts: LogFacts) -> bool:
    """NCCL's line grammar (``nccl_log.is_nccl_log``), and one of the lines this module reads."""
    log = facts.log
    return is_log(log) and bool(log.local_ranks or log.rings or log.trees or log.transports)


class _Facts:
    """The lines ``nccl_log`` does not keep, seen as the parser streams the file (every communicator's)."""

    def __init__(self):
        self.rank_of_pid: dict[tuple, int] = {}
        self.coll_channels: dict = {}
        self.choices: list = []
        self.choice_count = 0
        self.tuning_table = False
        self.info_lines = 0

    def __call__(self, host, pid, msg: str) -> None:
        self.info_lines += 1
        if msg.startswith("comm "):
            m = _RANK.match(msg)
            if m and host:
                self.rank_of_pid[(host, pid)] = int(m.group(1))
        elif " coll channels, " in msg:
            m = _COLL_CH.match(msg)
            if m and (host, pid) in self.rank_of_pid:
                self.coll_channels[self.rank_of_pid[(host, pid)]] = int(m.group(1))
        elif " Bytes -> Algo " in msg:
            m = _CHOICE.match(msg)
            if m:
                self.choice_count += 1
                if len(self.choices) < MAX_CHOICES:
                    self.choices.append((m.group(1), int(m.group(2)), m.group(3), m.group(4)))
        elif "Algorithm" in msg and "|" in msg:
            self.tuning_table = True


def _facts(log: NcclLog, seen: _Facts) -> LogFacts:
    return LogFacts(log, bad_lines=list(log.bad_lines), versions=list(log.versions), coll_channels=seen.coll_channels,
                    choices=seen.choices, tuning_table=seen.tuning_table,
                    ranks_seen=set(log.local_ranks) | {r for t in log.trees.values() for r in t},
                    info_lines=seen.info_lines, choice_count=seen.choice_count, bad_count=log.bad_count)


def read(text: str) -> LogFacts:
    """The facts of ``text``; never raises on partial or cut logs (entries that cannot be read, or that name ranks
    outside the communicator, are left out and listed in ``bad_lines``)."""
    seen = _Facts()
    return _facts(parse(text, strict=False, on_info=seen), seen)


def read_file(path: str) -> LogFacts:
    """``read`` of a file, streamed (``nccl_log.parse_file``): memory does not grow with the file."""
    seen = _Facts()
    return _facts(parse_file(path, strict=False, on_info=seen), seen)


def unusual(facts: LogFacts) -> list[str]:
    """What a reader should notice: missing ranks, channel counts that differ between ranks, cut lines."""
    log, out = facts.log, []
    n = log.nranks
    if n:
        missing = sorted(set(range(n)) - facts.ranks_seen)
        if missing:
            out.append(f"ranks {ranges(missing)} of {n} print no comm or Trees line (missing from the log, or "
                       f"the log was cut)")
    if log.trees:
        per_rank: dict[int, int] = {}
        for tree in log.trees.values():
            for r in tree:
                per_rank[r] = per_rank.get(r, 0) + 1
        counts = sorted(set(per_rank.values()))
        if len(counts) > 1:
            detail = "; ".join(f"{c} channels: ranks {ranges([r for r, k in per_rank.items() if k == c])}"
                               for c in counts)
            out.append(f"the ranks print Trees for different channel counts ({detail})")
    if len(set(facts.coll_channels.values())) > 1:
        out.append("coll channel counts differ between ranks: " + ", ".join(
            f"rank {r}: {c}" for r, c in sorted(facts.coll_channels.items())))
    if log.ring_total and log.rings and len(log.rings) != log.ring_total:
        out.append(f"rank 0 prints {len(log.rings)} of its {log.ring_total} rings")
    if log.truncated_rings:
        out.append(f"ring lines of channels {ranges(list(log.truncated_rings))} are cut with '...'")
    for c, ring in sorted(log.rings.items()):
        if n and c not in log.truncated_rings and sorted(ring) != list(range(n)):
            out.append(f"channel {c}'s ring is not a permutation of the {n} ranks: {ring}")
    if len(set(log.local_ranks.values())) > 1:
        out.append("nodes have different GPU counts (localRanks " + ranges(list(log.local_ranks.values())) + ")")
    if len(facts.versions) > 1:
        out.append("several NCCL versions in one log: " + ", ".join(facts.versions))
    for lineno, why in facts.bad_lines[:5]:
        out.append(f"line {lineno} left out: {why}")
    if facts.bad_count > 5:
        out.append(f"... {facts.bad_count - 5} more entries left out")
    return out


def nranks(facts: LogFacts) -> int:
    """The communicator's size: its ``nRanks``, else the highest rank any line names + 1 (0: none)."""
    log = facts.log
    named = facts.ranks_seen | {r for ring in log.rings.values() for r in ring} | {
        r for (_, a, b) in log.transports for r in (a, b)} | {
        p for t in log.trees.values() for up, downs in t.values() for p in (up, *downs)}
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
             f"ranks: {n}, nodes: {nnodes}, GPUs per node: {ranges(per_node) if per_node else 'unknown'}"
             + (f" (hosts {', '.join(sorted(set(log.host_of.values())))})" if log.host_of else "")]
    if node_of:
        by_node: dict[int, list[int]] = {}
        for r in range(min(n, len(node_of))):   # one pass: a node loop over the ranks is n x nodes
            by_node.setdefault(node_of[r], []).append(r)
        lines.append("ranks by node: " + "; ".join(f"node {k}: {ranges(by_node[k])}" for k in sorted(by_node)))
    nch = log.ring_total or len(log.rings) or len(log.trees)
    lines.append(f"channels: {nch}" + (f" (coll channels per rank: {ranges(list(facts.coll_channels.values()))})"
                                       if facts.coll_channels else ""))
    if log.rings:
        distinct: dict[tuple, list[int]] = {}
        for c, ring in sorted(log.rings.items()):
            distinct.setdefault(tuple(ring), []).append(c)
        lines.append(f"rings ({len(distinct)} distinct, rank 0's Channel lines):")
        for ring, chans in distinct.items():
            lines.append(f"  channels {ranges(chans)}: {' '.join(map(str, ring))}")
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
            lines.append(f"  {a} -> {b} ({where}): " + "; ".join(f"{v} on channels {ranges(cs)}"
                                                                 for v, cs in sorted(vias.items())))
    else:
        lines.append("transports: no 'Channel NN : a[d] -> b[d] via ...' lines (NCCL prints them at INIT)")
    if facts.choices or facts.tuning_table:
        lines.append(f"TUNING: {'the algorithm/protocol table is printed; ' if facts.tuning_table else ''}"
                     f"{max(facts.choice_count, len(facts.choices))} choice(s)")
        seen = set()
        for func, size, algo, proto in facts.choices:
            if (func, size) not in seen:
                seen.add((func, size))
                lines.append(f"  {func} {size} B -> {algo}/{proto}")
    else:
        lines.append("TUNING: none (NCCL_DEBUG_SUBSYS=TUNING prints the choices)")
    return lines
