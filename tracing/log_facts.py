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
    sm90_hints: list = field(default_factory=list)        # lines that only sm90 or later prints (NVLS), as named


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
        self.sm90_hints: list[str] = []

    def hint(self, what: str) -> None:
        if what not in self.sm90_hints:
            self.sm90_hints.append(what)

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
            if m and int(m.group(3)) > 0:
                self.hint("'N nvls channels' above 0")
        elif msg.startswith("NVLS Head"):
            self.hint("'NVLS Head' lines")
        elif msg.startswith("NVLS multicast support is available"):
            self.hint("'NVLS multicast support is available'")
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
                    info_lines=seen.info_lines, choice_count=seen.choice_count, bad_count=log.bad_count,
                    sm90_hints=seen.sm90_hints)


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


def complete_rings(log: NcclLog) -> list[list[int]] | None:
    """Rank 0's rings of every channel 0..MM-1 of its ``Channel NN/MM`` lines, when all are in the log uncut."""
    total = log.ring_total or len(log.rings)
    if not total or log.truncated_rings or sorted(log.rings) != list(range(total)):
        return None
    return [log.rings[c] for c in range(total)]


def ring_period(log: NcclLog) -> int | None:
    """The fewest channels p whose rings repeat over all of rank 0's (ring c == ring c mod p): ``ncclTopoPostset``
    (``src/graph/connect.cc``) gives channel c + n the ring of search channel c, and ``copyChannels`` copies
    whole channels, so p is the search's count, or less when the search's own rings repeat.  None: rings
    missing or cut."""
    rings = complete_rings(log)
    if rings is None:
        return None
    return next(p for p in range(1, len(rings) + 1) if all(rings[c] == rings[c % p] for c in range(len(rings))))


def node_segments(ring: list[int], node_of: list[int]) -> list[tuple] | None:
    """Each node's part of one ring, as local indexes (the rank's place among its node's ranks), from the rank the
    ring enters the node at; None when the ring enters some node twice (then it is no search chain)."""
    nnodes = max(node_of) + 1
    local = {}
    counts = [0] * nnodes
    for r in range(len(node_of)):
        local[r] = counts[node_of[r]]
        counts[node_of[r]] += 1
    segs: list = [None] * nnodes
    n = len(ring)
    for i, r in enumerate(ring):
        if node_of[ring[i - 1]] != node_of[r] or nnodes == 1 and i == 0:
            k = node_of[r]
            if segs[k] is not None:
                return None
            seg = [r]
            while len(seg) < n and node_of[ring[(i + len(seg)) % n]] == k:
                seg.append(ring[(i + len(seg)) % n])
            segs[k] = tuple(local[x] for x in seg)
    return None if None in segs else segs


def cross_nic_swap(log: NcclLog, node_of: list[int]) -> tuple[str, str]:
    """Whether rank 0's rings show ``ncclTopoPostset``'s crossNic-2 exchange (``src/graph/connect.cc``): on odd
    nodes the ring data of channels c and c^1 are swapped, so (nodes being alike) an odd node's part of ring c is
    node 0's part of ring c^1.  Returns (``swap`` | ``no swap`` | ``cannot tell``, why)."""
    rings = complete_rings(log)
    if not node_of or max(node_of) == 0:
        return "cannot tell", "one node: the exchange concerns odd nodes only"
    if rings is None:
        return "cannot tell", "rank 0's Channel NN/MM lines are missing or cut"
    if len(rings) % 2:
        return "cannot tell", f"{len(rings)} channels, an odd count (NCCL exchanges pairs only of an even count)"
    if any(len(ring) != len(node_of) for ring in rings):
        return "cannot tell", "the rings do not cover the communicator's ranks"
    segs = [node_segments(ring, node_of) for ring in rings]
    if None in segs:
        return "cannot tell", "a ring enters some node more than once"
    nnodes = max(node_of) + 1
    if all(segs[c][0] == segs[c ^ 1][0] for c in range(len(rings))):
        return "cannot tell", "node 0's paired channels (c, c^1) have the same order, so an exchange changes nothing"
    if any(segs[c][k] != segs[c][0] for c in range(len(rings)) for k in range(2, nnodes, 2)):
        return "cannot tell", "the even nodes' ring orders differ from node 0's"
    odd = range(1, nnodes, 2)
    if all(segs[c][k] == segs[c ^ 1][0] for c in range(len(rings)) for k in odd):
        return "swap", (f"node{'s' if nnodes > 2 else ''} {ranges(list(odd))}'s ring order on channel c is node 0's "
                        f"on channel c^1, on all {len(rings)} channels")
    if all(segs[c][k] == segs[c][0] for c in range(len(rings)) for k in odd):
        return "no swap", f"every node's ring order on channel c is node 0's on channel c ({len(rings)} channels)"
    return "cannot tell", "the odd nodes' ring orders match node 0's neither on c nor on c^1"


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
