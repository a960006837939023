"""Parser of real NCCL INFO logs (``NCCL_DEBUG=INFO``), and of ours, which prints the same lines.

Reads, from any mix of ranks' interleaved lines (``host:pid:tid [dev] NCCL INFO ...``):
* ``comm 0x… rank R nRanks N nNodes K localRanks L localRank l`` (``init.cc``);
* ``Channel NN/MM : r0 r1 …`` (rank 0's rings, ``ncclBuildRings``; a line cut with ``...`` is kept partial);
* ``Trees [c] d0/d1/d2->rank->up …`` (every rank's trees, one line per rank);
* ``Channel NN/x : a[dev] -> b[dev] [send] via P2P/CUMEM/read`` (the transport of each ring edge);
* ``Pattern P, crossNic X, nChannels C, bw A/B, type T/U, sameChannels S`` and the GRAPH channel lines after it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_PREFIX = re.compile(r"^\s*([^\s:]+):(\d+):(\d+) \[\d+\] NCCL INFO")
_COMM = re.compile(r"comm (0x[0-9a-f]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)")
_RING = re.compile(r"NCCL INFO Channel (\d+)/(\d+) :((?: +\d+)+)( \.\.\.)?\s*$")
_TREE = re.compile(r"\[(\d+)\] (-?\d+)/(-?\d+)/(-?\d+)->(\d+)->(-?\d+)")
_PATTERN = re.compile(r"Pattern (\d+), crossNic (\d+), nChannels (\d+), (?:bw|speed) ([\d.]+)/([\d.]+), "
                      r"type (\w+)/(\w+), sameChannels (\d+)")
_CONN = re.compile(r"Channel (\d+)(?:/\d+)? : (\d+)\[[^]]*\] -> (\d+)\[[^]]*\](?: \[(?:send|receive)\])? via (\S+)")
_GRAPH_CH = re.compile(r"NCCL INFO +(\d+) : (.*)$")
TREE_PATTERNS = {1: "BALANCED_TREE", 2: "SPLIT_TREE", 3: "TREE"}  # NCCL_TOPO_PATTERN_* of the tree graph


@dataclass
class NcclLog:
    nranks: int = 0
    nnodes: int = 0
    local_ranks: dict = field(default_factory=dict)      # rank -> localRanks
    rings: dict = field(default_factory=dict)            # channel -> ring from rank 0
    ring_total: int = 0
    truncated_rings: set = field(default_factory=set)
    trees: dict = field(default_factory=dict)            # channel -> {rank: (up, [down...])}
    host_of: dict = field(default_factory=dict)          # rank -> host (from the line prefix host:pid:tid)
    tree_lines: dict = field(default_factory=dict)       # rank -> line number of its Trees line
    transports: dict = field(default_factory=dict)       # (channel, from, to) -> "P2P/CUMEM/read", "SHM/direct/direct", ...
    patterns: list = field(default_factory=list)         # (pattern, nChannels, bwIntra, bwInter, typeIntra, typeInter, channel lines)
    tree_graphs: dict = field(default_factory=dict)      # host -> (tree pattern 1|2|3, [[GPU ranks] per graph channel])


class LogError(ValueError):
    """A line that looks like NCCL's but cannot be read; the message names the line."""


def parse(text: str) -> NcclLog:
    log = NcclLog()
    current_pattern = None
    for lineno, line in enumerate(text.splitlines(), 1):
        pm = _PREFIX.match(line)
        host = pm.group(1) if pm else None
        m = _COMM.search(line)
        if m:
            rank = int(m.group(2))
            if host:
                log.host_of.setdefault(rank, host)
            log.nranks, log.nnodes = int(m.group(3)), int(m.group(4))
            log.local_ranks[rank] = int(m.group(5))
            continue
        m = _CONN.search(line)
        if m:
            log.transports[(int(m.group(1)), int(m.group(2)), int(m.group(3)))] = m.group(4)
            continue
        m = _RING.search(line)
        if m:
            c = int(m.group(1))
            log.ring_total = int(m.group(2))
            log.rings.setdefault(c, [int(x) for x in m.group(3).split()])
            if m.group(4):
                log.truncated_rings.add(c)
            continue
        if "NCCL INFO Trees " in line:
            entries = _TREE.findall(line)
            body = line.split("NCCL INFO Trees ", 1)[1].strip()
            if not entries or len(entries) != body.count("["):
                raise LogError(f"line {lineno}: cannot read the Trees entries: {line.strip()[:200]}")
            for c, d0, d1, d2, r, up in entries:
                downs = [int(x) for x in (d0, d1, d2) if int(x) != -1]
                log.trees.setdefault(int(c), {})[int(r)] = (int(up), downs)
                log.tree_lines[int(r)] = lineno
                if host:
                    log.host_of.setdefault(int(r), host)
            continue
        m = _PATTERN.search(line)
        if m:
            current_pattern = (int(m.group(1)), int(m.group(3)), float(m.group(4)), float(m.group(5)),
                               m.group(6), m.group(7), [])
            log.patterns.append(current_pattern)
            if current_pattern[0] in TREE_PATTERNS and host and host not in log.tree_graphs:
                log.tree_graphs[host] = (current_pattern[0], current_pattern[6])  # the tree search of this host
            continue
        m = _GRAPH_CH.search(line)
        if m and current_pattern is not None and ("GPU/" in m.group(2) or "NET/" in m.group(2)):
            current_pattern[6].append(m.group(2).split())
    if not log.nranks and log.rings:
        log.nranks = max(len(r) for r in log.rings.values())
    return log
