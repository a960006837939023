"""Parser of real NCCL INFO logs (``NCCL_DEBUG=INFO``), and of ours, which prints the same lines.

A line is NCCL's when it has the form ``src/debug.cc``'s ``ncclDebugLog`` writes: ``[timestamp] host:pid:tid [dev]
NCCL INFO msg`` (``NCCL WARN`` / ``TRACE`` / ``CALL`` likewise, the timestamp optional), or the forms users paste:
the same after a launcher prefix (``0: ``, ``[1,0]<stdout>:``, ``[default0]:``), and bare ``NCCL INFO msg`` lines
with the host prefix cut away; plus the prefix-less ``NCCL version …`` line of the VERSION level.  Only INFO lines
are read, and in them only the message (so a document that quotes a line in prose is not read as a log):
* ``comm 0x… rank R nRanks N nNodes K localRanks L localRank l`` (``init.cc``);
* ``Channel NN/MM : r0 r1 …`` (rank 0's rings, ``ncclBuildRings``; a line cut with ``...`` is kept partial);
* ``Trees [c] d0/d1/d2->rank->up …`` (every rank's trees, one line per rank);
* ``Channel NN/x : a[dev] -> b[dev] [send] via P2P/CUMEM/read`` (the transport of each ring edge);
* ``Pattern P, crossNic X, nChannels C, bw A/B, type T/U, sameChannels S`` and the GRAPH channel lines after it.

Logs as users paste them: a ``Trees`` line cut at NCCL's 1023-character buffer keeps its complete entries; and a
log of several communicators is split by process: each ``host:pid`` line belongs to the communicator that process
last announced (``comm 0x… rank …``), and the communicators of different ranks are matched by the ``commId`` of
their ``Init COMPLETE`` line (else by their size and order of creation in each process).  ``communicators(text)``
lists them; ``parse`` takes the largest, or ``comm``.

Cost: a file is streamed twice, line by line (``parse_file``: which process belongs to which communicator, then
that communicator's lines); what is kept is what the log says (rings, trees, edges), never its text, and a line
longer than any NCCL prints (its buffer is 1024 bytes) is read up to ``MAX_LINE`` characters.

Ranks are checked against the communicator once it is read: NCCL prints -1 for "none" and 0..nRanks-1 otherwise,
and channels are below ``MAXCHANNELS`` (``src/include/device.h``).  ``strict`` parsing raises ``LogError`` on the
first line that breaks this (or cannot be read); lenient parsing leaves the line's entry out and lists it in
``bad_lines``.
"""
from __future__ import annotations

import io
import re
from contextlib import closing
from dataclasses import dataclass, field

# NCCL's MAXCHANNELS (src/include/device.h), the log's bound on a channel number.  The parser sits on the
# bottom floor, under collectives/include/device.py, which owns the constant; tests/test_layers.py checks the two agree.
MAXCHANNELS = 64
MAX_LINE = 4096             # characters read of one line: NCCL's buffer is 1024 bytes, plus prefixes
MAX_RANKS = 1 << 20         # a larger nRanks is not a real log (and would size every per-rank list)
MAX_BAD = 100               # bad lines listed (all are counted)
MAX_PATTERNS = 256          # GRAPH Pattern lines kept (each rank prints a few per communicator)
MAX_VERSIONS = 16           # distinct "NCCL version" strings kept

# NCCL's line grammar (debug.cc).  The host has no ':', blank or bracket; what precedes it is a launcher's.
_HOST_INFO = re.compile(r"(?:^|[\s:\]>])([^\s:\[\]]+):(\d+):(\d+) \[\d+\] $")
_HOST_ANY = re.compile(r"(?:^|[\s:\]>])[^\s:\[\]]+:\d+:\d+ (?:\[-?\d+\] )?(?:\S+ ){0,2}NCCL (?:INFO|WARN|TRACE|CALL)\b")
_BARE_HEAD = re.compile(r"\s*(?:\S*[:\]>]\s*)?")
_VERSION_LINE = re.compile(r"\s*(?:\S*[:\]>]\s*)?NCCL version (\S+)\s*$")

_COMPLETE = re.compile(r"comm (0x[0-9a-f]+) rank \d+ nranks \d+ .*commId (0x[0-9a-f]+) - Init COMPLETE")
_COMM = re.compile(r"comm (0x[0-9a-f]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)")
_RING = re.compile(r"Channel (\d+)/(\d+) :((?: +\d+)+)( \.\.\.)?\s*$")
_TREE = re.compile(r"\[(\d+)\] (-?\d+)/(-?\d+)/(-?\d+)->(\d+)->(-?\d+)")
_PATTERN = re.compile(r"Pattern (\d+), crossNic (\d+), nChannels (\d+), (?:bw|speed) (\d+(?:\.\d*)?)/(\d+(?:\.\d*)?), "
                      r"type (\w+)/(\w+), sameChannels (\d+)")
_CONN = re.compile(r"Channel (\d+)(?:/\d+)? : (\d+)\[[^]]*\] -> (\d+)\[[^]]*\](?: \[(?:send|receive)\])? via (\S+)")
_GRAPH_CH = re.compile(r" +(\d+) : (.*)$")
_VERSION = re.compile(r"NCCL version (\S+)")
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
    # (pattern, nChannels, bwIntra, bwInter, typeIntra, typeInter, channel lines), the first MAX_PATTERNS
    patterns: list = field(default_factory=list)
    tree_graphs: dict = field(default_factory=dict)      # host -> (tree pattern 1|2|3, [[GPU ranks] per graph channel])
    graph_heads: dict = field(default_factory=dict)      # host -> [(pattern, crossNic, nChannels)] of its Pattern lines
    comm: str = ""                                       # which communicator (commId, or "#k" by creation order)
    communicators: list = field(default_factory=list)    # every one in the log: {id, nranks, nnodes, ranks}
    versions: list = field(default_factory=list)         # "NCCL version" strings, in order
    bad_lines: list = field(default_factory=list)        # (line number, why) of entries left out (lenient)
    bad_count: int = 0                                   # all of them (bad_lines keeps the first MAX_BAD)
    grammar: dict = field(default_factory=dict)          # line counts: prefixed, bare, other (is_nccl_log)


class LogError(ValueError):
    """A line that looks like NCCL's but cannot be read, or a file that is not an NCCL log; the message names the
    line."""


def info_line(line: str):
    """``(host, pid, message)`` of an NCCL INFO line (host and pid None for a bare paste), else None."""
    i = line.find("NCCL INFO ")
    if i < 0:
        return None
    head = line[:i]
    m = _HOST_INFO.search(head)
    if m:
        return m.group(1), m.group(2), line[i + 10:].rstrip("\r\n")
    if _BARE_HEAD.fullmatch(head):
        return None, None, line[i + 10:].rstrip("\r\n")
    return None


def bounded_lines(f):
    """The lines of ``f`` (closed at the end), each cut at ``MAX_LINE`` characters (the rest of a longer line is
    skipped unread)."""
    with f:
        while True:
            line = f.readline(MAX_LINE)
            if not line:
                return
            if len(line) == MAX_LINE and not line.endswith("\n"):
                while True:
                    rest = f.readline(MAX_LINE)
                    if not rest or rest.endswith("\n"):
                        break
            yield line


def _opener(source):
    """A function returning a fresh iterator over the lines of ``source``: text, or a ``Path``/file name given
    through ``parse_file``."""
    if isinstance(source, _File):
        return lambda: bounded_lines(open(source.path, errors="replace"))
    return lambda: bounded_lines(io.StringIO(source, newline=None))


@dataclass(frozen=True)
class _File:
    path: str


class _Split:
    """First pass: which communicator each process announced when (``comm 0x… rank``), and their commIds."""

    def __init__(self, on_info=None):
        self.current: dict = {}       # (host, pid) -> comm pointer it announced last
        self.per_proc: dict = {}      # (host, pid) -> {its comm pointers: None}, in creation order
        self.info: dict = {}          # (host, pid, pointer) -> (rank, nranks, nnodes)
        self.comm_id: dict = {}       # (host, pid, pointer) -> commId
        self.grammar = {"prefixed": 0, "bare": 0, "other": 0}
        self.versions: list = []
        self.on_info = on_info
        self._keys: dict | None = None   # owner -> communicator id, once the scan is over

    def feed(self, line: str):
        """The line's owner (host, pid, pointer) or None, and its INFO fields (or None)."""
        parsed = info_line(line)
        g = self.grammar
        if parsed is None:
            if "NCCL " in line and _HOST_ANY.search(line):
                g["prefixed"] += 1                       # WARN, TRACE, CALL
            elif line.strip():
                m = _VERSION_LINE.match(line)            # the VERSION level has no host prefix
                if m:
                    g["bare"] += 1
                    if m.group(1) not in self.versions and len(self.versions) < MAX_VERSIONS:
                        self.versions.append(m.group(1))
                else:
                    g["other"] += 1
            return None, None
        host, pid, msg = parsed
        g["prefixed" if host else "bare"] += 1
        proc = (host, pid) if host else None
        if msg.startswith("comm "):
            m = _COMM.match(msg)
            if m and proc:
                self.current[proc] = m.group(1)
                self.per_proc.setdefault(proc, {}).setdefault(m.group(1), None)
                self.info[(*proc, m.group(1))] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
            m = _COMPLETE.match(msg)
            if m and proc:
                self.comm_id[(*proc, m.group(1))] = m.group(2)
        elif msg.startswith("NCCL version "):
            m = _VERSION.match(msg)
            if m and m.group(1) not in self.versions and len(self.versions) < MAX_VERSIONS:
                self.versions.append(m.group(1))
        if self.on_info is not None:
            self.on_info(host, pid, msg)
        owner = (*proc, self.current[proc]) if proc and proc in self.current else None
        return owner, parsed

    def key(self, k) -> str | None:
        """The communicator id of owner ``k`` (all of them worked out once, in one pass over the processes)."""
        if k is None:
            return None
        if self._keys is None:
            self._keys = {}
            for proc, pointers in self.per_proc.items():
                made: dict = {}       # (nranks, nnodes) -> how many this process created so far
                for p in pointers:
                    size = self.info[(*proc, p)][1:]
                    # without Init COMPLETE lines: the k-th communicator of its size that each process created
                    self._keys[(*proc, p)] = self.comm_id.get((*proc, p), f"{size[0]}-ranks#{made.get(size, 0)}")
                    made[size] = made.get(size, 0) + 1
        return self._keys[k]

    def communicators(self) -> list[dict]:
        comms: dict = {}
        for k, (rank, nranks, nnodes) in self.info.items():
            c = comms.setdefault(self.key(k), {"id": self.key(k), "nranks": nranks, "nnodes": nnodes, "ranks": set()})
            c["ranks"].add(rank)
        return [{**c, "ranks": sorted(c["ranks"])} for c in comms.values()]


def _scan(opener, on_info=None) -> _Split:
    split = _Split(on_info)
    with closing(opener()) as lines:
        for line in lines:
            split.feed(line)
    return split


def communicators(text: str) -> list[dict]:
    """The communicators a log initialises: [{id, nranks, nnodes, ranks (those present)}], in order of their first
    comm line."""
    return _scan(_opener(text)).communicators()


def parse(text: str, comm: str | None = None, strict: bool = True, on_info=None) -> NcclLog:
    """One communicator's lines: ``comm`` (its commId, ``N-ranks#k``, or its index in ``communicators``), else
    the largest (most ranks, then the first).  ``strict``: a line that cannot be read raises ``LogError``;
    otherwise its entry is left out and listed in ``bad_lines``.  ``on_info``: as for ``parse_file``."""
    return _parse(_opener(text), comm, strict, on_info)


def parse_file(path: str, comm: str | None = None, strict: bool = True, on_info=None) -> NcclLog:
    """``parse`` of a file, streamed line by line (twice); ``on_info(host, pid, message)`` sees every INFO line of
    the first pass, whichever communicator it belongs to."""
    return _parse(_opener(_File(str(path))), comm, strict, on_info)


def _parse(opener, comm, strict: bool, on_info=None) -> NcclLog:
    split = _scan(opener, on_info)
    comms = split.communicators()
    chosen = None
    if comm is not None:
        chosen = next((c for i, c in enumerate(comms) if comm in (c["id"], str(i))), None)
        if chosen is None:
            have = ", ".join(f"{c['id']} ({c['nranks']} ranks)" for c in comms) or "none"
            raise LogError(f"no communicator {comm!r} in the log (have: {have})")
    elif comms:
        chosen = max(enumerate(comms), key=lambda ic: (ic[1]["nranks"], -ic[0]))[1]
    reader = _Reader(strict)
    keys: dict = {}
    again = _Split()           # the first pass's state machine, replayed to know each line's owner
    with closing(opener()) as lines:
        for lineno, line in enumerate(lines, 1):
            owner, parsed = again.feed(line)
            if parsed is None:
                continue
            if len(comms) > 1 and owner is not None:
                if owner not in keys:
                    keys[owner] = split.key(owner)
                if keys[owner] != chosen["id"]:
                    continue
            reader.feed(lineno, parsed)
    log = reader.finish()
    log.comm = chosen["id"] if chosen else ""
    log.communicators = comms
    log.versions = split.versions
    log.grammar = split.grammar
    return log


class _Reader:
    """Second pass: one communicator's INFO messages into an ``NcclLog``."""

    def __init__(self, strict: bool):
        self.log = NcclLog()
        self.strict = strict
        self.pattern = None
        self.comm_lines: dict = {}   # rank -> line number of its comm line
        self.ring_lines: dict = {}   # channel -> line number
        self.conn_lines: dict = {}   # (channel, a, b) -> line number

    def bad(self, lineno: int, why: str) -> None:
        if self.strict:
            raise LogError(f"line {lineno}: {why}")
        self.log.bad_count += 1
        if len(self.log.bad_lines) < MAX_BAD:
            self.log.bad_lines.append((lineno, why))

    def feed(self, lineno: int, parsed) -> None:
        host, _, msg = parsed
        log = self.log
        if msg.startswith("comm "):
            m = _COMM.match(msg)
            if m:
                rank, n, nnodes, local, local_rank = (int(m.group(i)) for i in range(2, 7))
                if not (0 <= rank < n <= MAX_RANKS and 0 < nnodes <= n and 0 < local <= n and local_rank < local):
                    self.bad(lineno, f"comm line of rank {rank}: nRanks {n} nNodes {nnodes} localRanks {local} "
                                     f"localRank {local_rank} do not fit together")
                    return
                if host:
                    log.host_of.setdefault(rank, host)
                log.nranks, log.nnodes = n, nnodes
                log.local_ranks[rank] = local
                self.comm_lines[rank] = lineno
            return
        if msg.startswith("Channel "):
            m = _CONN.match(msg)
            if m:
                key = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
                if key[0] >= MAXCHANNELS:
                    return self.bad(lineno, f"channel {key[0]} is not below MAXCHANNELS ({MAXCHANNELS})")
                log.transports[key] = m.group(4)
                self.conn_lines.setdefault(key, lineno)
                return
            m = _RING.match(msg)
            if m:
                c, total = int(m.group(1)), int(m.group(2))
                if c >= MAXCHANNELS or total > MAXCHANNELS:
                    return self.bad(lineno, f"channel {c}/{total} is not below MAXCHANNELS ({MAXCHANNELS})")
                log.ring_total = total
                if c not in log.rings:
                    log.rings[c] = [int(x) for x in m.group(3).split()]
                    self.ring_lines[c] = lineno
                if m.group(4):
                    log.truncated_rings.add(c)
            return
        if msg.startswith("Trees "):
            self._trees(lineno, host, msg[5:])
            return
        if msg.startswith("Pattern "):
            m = _PATTERN.match(msg)
            if m:
                self.pattern = (int(m.group(1)), int(m.group(3)), float(m.group(4)), float(m.group(5)),
                                m.group(6), m.group(7), [])
                if len(log.patterns) < MAX_PATTERNS:
                    log.patterns.append(self.pattern)
                    if host:
                        log.graph_heads.setdefault(host, []).append((self.pattern[0], int(m.group(2)),
                                                                     self.pattern[1]))
                if self.pattern[0] in TREE_PATTERNS and host and host not in log.tree_graphs:
                    log.tree_graphs[host] = (self.pattern[0], self.pattern[6])  # the tree search of this host
            return
        m = _GRAPH_CH.match(msg)
        if m and self.pattern is not None and ("GPU/" in m.group(2) or "NET/" in m.group(2)) and \
                len(self.pattern[6]) < MAXCHANNELS:
            self.pattern[6].append(m.group(2).split())

    def _trees(self, lineno: int, host, body: str) -> None:
        if len(body) >= 1022 and "[" in body:  # NCCL's 1024-byte buffer ran out: the last entry may be cut anywhere
            body = body[:body.rindex("[")]
        entries = _TREE.findall(body)
        if not entries or len(entries) != body.count("["):
            return self.bad(lineno, f"cannot read the Trees entries: {body.strip()[:200]}")
        for c, d0, d1, d2, r, up in entries:
            c, r = int(c), int(r)
            if c >= MAXCHANNELS:
                self.bad(lineno, f"Trees [{c}] of rank {r}: channel {c} is not below MAXCHANNELS ({MAXCHANNELS})")
                continue
            peers = [int(x) for x in (d0, d1, d2, up)]
            low = next((p for p in peers if p < -1), None)
            if low is not None:
                self.bad(lineno, f"Trees [{c}] of rank {r} names rank {low} (NCCL prints -1 for none)")
                continue
            downs = [p for p in peers[:3] if p != -1]
            self.log.trees.setdefault(c, {})[r] = (peers[3], downs)
            self.log.tree_lines[r] = lineno
            if host:
                self.log.host_of.setdefault(r, host)

    def finish(self) -> NcclLog:
        """Check every rank against the communicator's size (nRanks, else the highest rank named + 1)."""
        log = self.log
        if not log.nranks and log.rings:
            log.nranks = max(len(r) for r in log.rings.values())
        n = log.nranks or MAX_RANKS
        what = f"0..{n - 1}" if log.nranks else f"below {MAX_RANKS}"
        for c in sorted(log.trees):
            for r, (up, downs) in sorted(log.trees[c].items()):
                out = next((p for p in (r, up, *downs) if p >= n), None)
                if out is not None:
                    self.bad(log.tree_lines.get(r, 0), f"Trees [{c}] of rank {r} names rank {out}, outside the "
                                                       f"communicator's ranks {what}")
                    del log.trees[c][r]
            if not log.trees[c]:
                del log.trees[c]
        for c in sorted(log.rings):
            out = next((r for r in log.rings[c] if r >= n), None)
            if out is not None:
                self.bad(self.ring_lines[c], f"ring of channel {c} names rank {out}, outside the communicator's "
                                             f"ranks {what}")
                del log.rings[c]
        for key in sorted(log.transports):
            out = next((r for r in key[1:] if r >= n), None)
            if out is not None:
                self.bad(self.conn_lines[key], f"channel {key[0]} edge {key[1]} -> {key[2]} names rank {out}, "
                                               f"outside the communicator's ranks {what}")
                del log.transports[key]
        for r in [r for r in log.local_ranks if r >= n]:
            self.bad(self.comm_lines[r], f"comm line of rank {r}: outside the communicator's ranks {what}")
            del log.local_ranks[r]
            log.host_of.pop(r, None)
        for r in [r for r in log.host_of if r >= n]:
            del log.host_of[r]
        return log


def is_nccl_log(log: NcclLog) -> bool:
    """Enough lines of NCCL's grammar: two with the ``host:pid:tid`` prefix (a job's output may hold any amount
    of other text), or, for a bare paste, two that are at least as many as the other lines."""
    g = log.grammar
    return g.get("prefixed", 0) >= 2 or (g.get("prefixed", 0) + g.get("bare", 0) >= 2 and
                                         g.get("prefixed", 0) + g.get("bare", 0) >= g.get("other", 0))
