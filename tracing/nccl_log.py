"""Parser of real NCCL INFO logs (``NCCL_DEBUG=INFO``), and of ours, which prints the same lines.

Reads, from any mix of ranks' interleaved lines (``host:pid:tid [dev] NCCL INFO ...``):
* ``comm 0x… rank R nRanks N nNodes K localRanks L localRank l`` (``init.cc``);
* ``Channel NN/MM : r0 r1 …`` (rank 0's rings, ``ncclBuildRings``; a line cut with ``...`` is kept partial);
* ``Trees [c] d0/d1/d2->rank->up …`` (every rank's trees, one line per rank);
* ``Channel NN/x : a[dev] -> b[dev] [send] via P2P/CUMEM/read`` (the transport of each ring edge);
* ``Pattern P, crossNic X, nChannels C, bw A/B, type T/U, sameChannels S`` and the GRAPH channel lines after it.

Logs as users paste them: lines may carry a launcher prefix (``0: host:pid:tid ...``); a ``Trees`` line cut at
NCCL's 1023-character buffer keeps its complete entries; and a log of several communicators is split by process:
each ``host:pid`` line belongs to the communicator that process last announced (``comm 0x… rank …``), and the
communicators of different ranks are matched by the ``commId`` of their ``Init COMPLETE`` line (else by their size
and order of creation in each process).  ``communicators(text)`` lists them; ``parse`` takes the largest, or ``comm``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_PREFIX = re.compile(r"(?:^|\s)([^\s:]+):(\d+):(\d+) \[\d+\] NCCL INFO")
_COMPLETE = re.compile(r"comm (0x[0-9a-f]+) rank \d+ nranks \d+ .*commId (0x[0-9a-f]+) - Init COMPLETE")
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
    transports: dict = field(default_factory=dict)       # (channel, from, to) -> "P2P/CUMEM/read", "SHM/direct", ...
    patterns: list = field(default_factory=list)         # (pattern, nChannels, bwIntra, bwInter, typeIntra, typeInter, channel lines)
    tree_graphs: dict = field(default_factory=dict)      # host -> (tree pattern 1|2|3, [[GPU ranks] per graph channel])
    comm: str = ""                                       # which communicator (commId, or "#k" by creation order)
    communicators: list = field(default_factory=list)    # every one in the log: {id, nranks, nnodes, ranks}


class LogError(ValueError):
    """A line that looks like NCCL's but cannot be read; the message names the line."""


def _split(lines: list[str]) -> tuple[dict, list]:
    """{communicator id: [line numbers]} and the communicators in order of first appearance."""
    current: dict = {}       # (host, pid) -> comm pointer it announced last
    per_proc: dict = {}      # (host, pid) -> its comm pointers, in creation order
    info: dict = {}          # (host, pid, pointer) -> (rank, nranks, nnodes)
    comm_id: dict = {}       # (host, pid, pointer) -> commId
    owner: list = []
    for line in lines:
        pm = _PREFIX.search(line)
        proc = (pm.group(1), pm.group(2)) if pm else None
        m = _COMM.search(line)
        if m and proc:
            current[proc] = m.group(1)
            if m.group(1) not in per_proc.setdefault(proc, []):
                per_proc[proc].append(m.group(1))
            info[(*proc, m.group(1))] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
        m = _COMPLETE.search(line)
        if m and proc:
            comm_id[(*proc, m.group(1))] = m.group(2)
        owner.append((*proc, current[proc]) if proc and proc in current else None)

    def key(k) -> str:
        if k in comm_id:
            return comm_id[k]
        # without Init COMPLETE lines: the k-th communicator of its size that each process created
        same = [p for p in per_proc[k[:2]] if info[(*k[:2], p)][1:] == info[k][1:]]
        return f"{info[k][1]}-ranks#{same.index(k[2])}"
    groups: dict = {}
    comms: dict = {}
    for i, k in enumerate(owner):
        g = key(k) if k is not None else None
        groups.setdefault(g, []).append(i)
        if k is not None and k in info:
            rank, nranks, nnodes = info[k]
            c = comms.setdefault(g, {"id": g, "nranks": nranks, "nnodes": nnodes, "ranks": set()})
            c["ranks"].add(rank)
    return groups, [{**c, "ranks": sorted(c["ranks"])} for c in comms.values()]


def communicators(text: str) -> list[dict]:
    """The communicators a log initialises: [{id, nranks, nnodes, ranks (those present)}], in order."""
    return _split(text.splitlines())[1]


def parse(text: str, comm: str | None = None) -> NcclLog:
    """One communicator's lines: ``comm`` (its commId, ``N-ranks#k``, or its index in ``communicators``), else
    the largest (most ranks, then the first)."""
    lines = text.splitlines()
    groups, comms = _split(lines)
    chosen = None
    if comm is not None:
        chosen = next((c for i, c in enumerate(comms) if comm in (c["id"], str(i))), None)
        if chosen is None:
            have = ", ".join(f"{c['id']} ({c['nranks']} ranks)" for c in comms) or "none"
            raise LogError(f"no communicator {comm!r} in the log (have: {have})")
    elif comms:
        chosen = max(comms, key=lambda c: (c["nranks"], -comms.index(c)))
    keep = set(range(len(lines)))
    if chosen is not None and len(comms) > 1:
        keep = set(groups.get(chosen["id"], [])) | set(groups.get(None, []))
    log = _parse_lines([(i + 1, lines[i]) for i in sorted(keep)])
    log.comm = chosen["id"] if chosen else ""
    log.communicators = comms
    return log


def _parse_lines(numbered: list) -> NcclLog:
    log = NcclLog()
    current_pattern = None
    for lineno, line in numbered:
        pm = _PREFIX.search(line)
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
            body = line.split("NCCL INFO Trees", 1)[1].rstrip("\r\n")
            if len(body) >= 1022:  # NCCL's 1024-byte buffer ran out: the last entry may be cut anywhere
                body = body[:body.rindex("[")]
            entries = _TREE.findall(body)
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
