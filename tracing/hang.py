"""Hang diagnosis: a report per failed rank, and a merge that names the rank that caused the hang, or the
mismatched calls when it was no hang.

When a rank's wait passes its deadline (or a peer's abort reaches it), it writes ``hang-rank<r>.json`` with
what every channel was waiting for: the collective and opCount, the primitive, the step and FIFO slot, the peer,
and the counter (tail, head, LL/LL128 flag), plus its last trace events when tracing is on; ``kind`` says what
failed (``failure_kind``) and ``call`` what this rank called.  A rank that finds a collective mismatch writes its
report too, even if it found it before blocking.
``diagnose`` looks for a mismatch first: if any report's error is one (the rank's own, or a peer's that its
abort carried), that is the verdict, with the calls grouped and the odd one out named; the waits are only its
echo (issue 24: a rank that found the mismatch at once, and so had no wait to report, was named "the rank that
caused the hang").  Otherwise it builds the wait-for graph: a rank that others wait for but that wrote no
report never entered the collective, died, or is stuck outside it; if every rank is waiting, the one furthest
behind (lowest opCount) is the cause; otherwise it is a cycle (mismatched calls).
Reports go to ``NCCLLAB_HANG_DIR``, else the trace directory, else ``$TMPDIR/nccllab-hangs/<comm tag>``; the
rank prints the path.  Only the newest ``KEEP`` runs are kept under ``$TMPDIR/nccllab-hangs``.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import tempfile


KEEP = 20
MISMATCH = "collective mismatch"  # collectives.health's line: "rank 2: collective mismatch with rank 1 at ..."
_MISMATCH_LINE = re.compile(r"rank (\d+): collective mismatch with rank (\d+) at opCount (\d+): this rank called "
                            r"(.+?\)), rank \d+ called (.+?\))")
_UNKNOWN_CALL = "a different collective"  # the peer's signature at this opCount was not there to read


def failure_kind(error: str, timed_out: bool = False) -> str:
    """What a report's ``error`` says failed: ``mismatch`` when it is a collective mismatch or carries one (a
    peer's abort message quotes the peer's error), ``hang`` for a deadline (here or quoted), else ``error`` (a
    peer gone, a destroyed communicator, a transport)."""
    if MISMATCH in error:
        return "mismatch"
    if timed_out or "made no progress" in error:
        return "hang"
    return "error"


def report_dir(tag: str) -> str:
    chosen = os.environ.get("NCCLLAB_HANG_DIR", "").strip() or os.environ.get("NCCLLAB_TRACE", "").strip()
    if chosen:
        return chosen
    parent = os.path.join(tempfile.gettempdir(), "nccllab-hangs")
    _prune(parent, KEEP - 1)
    return os.path.join(parent, tag)


def _prune(parent: str, keep: int) -> None:
    """Remove all but the newest ``keep`` run folders (several ranks may prune at once: ignore races)."""
    try:
        runs = sorted((e for e in os.scandir(parent) if e.is_dir()), key=lambda e: e.stat().st_mtime)
    except OSError:
        return
    for entry in runs[:max(0, len(runs) - keep)]:
        shutil.rmtree(entry.path, ignore_errors=True)


def write_report(directory: str, report: dict) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"hang-rank{report['rank']}.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)
    return path


def load_reports(directory: str) -> dict[int, dict]:
    reports = {}
    for path in glob.glob(os.path.join(directory, "hang-rank*.json")):
        with open(path) as f:
            r = json.load(f)
        reports[r["rank"]] = r
    return reports


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(map(str, ranks))


def mismatch_verdict(reports: dict[int, dict]) -> dict | None:
    """The mismatch among ``reports``, if any error is one: each rank's call (from its report, and from the lines
    that name a peer's), grouped; the odd one out is the culprit when the others agree."""
    found = [m for rep in reports.values() for m in _MISMATCH_LINE.finditer(rep.get("error", ""))]
    if not found and not any(rep.get("kind") == "mismatch" for rep in reports.values()):
        return None
    calls: dict[int, str] = {}
    for m in found:
        me, peer, mine, theirs = int(m[1]), int(m[2]), m[4], m[5]
        calls.setdefault(me, mine)
        if not theirs.startswith(_UNKNOWN_CALL):
            calls.setdefault(peer, theirs)
    for r, rep in reports.items():  # a rank's own word for its call wins over a peer's quote of it
        if rep.get("call"):
            calls[r] = rep["call"]
    op = found[0][3] if found else next(iter(reports.values()))["op_count"]
    groups: dict[str, list[int]] = {}
    for r, call in sorted(calls.items()):
        groups.setdefault(call, []).append(r)
    order = list(groups.items())  # by lowest rank
    culprit = None
    if len(order) < 2:  # one call known (the peer's was not there to read): say what the line said
        said = (f"rank {found[0][1]} called {found[0][4]}, rank {found[0][2]} called {found[0][5]}" if found
                else "a rank called another collective")
    else:
        largest = max(order, key=lambda g: len(g[1]))
        odd = [r for call, ranks in order if call != largest[0] for r in ranks]
        if len(odd) == 1 and len(largest[1]) > 1:  # all the others agree: the odd one out first
            culprit = odd[0]
            order = [g for g in order if g is not largest] + [largest]
        said = ", ".join(f"{_ranks(ranks)} called {call}" for call, ranks in order)
    return {"culprit": culprit, "kind": "mismatch", "reason": f"{MISMATCH} at opCount {op}, not a hang: {said}"}


def diagnose(directory: str) -> dict:
    """{'culprit': rank or None, 'kind': 'mismatch' | 'hang', 'reason': text, 'waits': [...]}."""
    reports = load_reports(directory)
    if not reports:
        return {"culprit": None, "kind": "hang", "reason": f"no hang reports in {directory}", "waits": []}
    nranks = next(iter(reports.values()))["nranks"]
    waits = [(r, w["peer"], w) for r, rep in sorted(reports.items()) for w in rep["waits"]]
    waited_on = {peer for _, peer, _ in waits}
    silent = sorted(p for p in waited_on if p not in reports)
    lines = [f"rank {r} {rep['func']} opCount {rep['op_count']}: " +
             "; ".join(f"channel {w['channel']} {w['prim']} step {w['step']} slot {w['slot']} waits for "
                       f"{w['what']} from rank {w['peer']}" for w in rep["waits"]) for r, rep in sorted(reports.items())]
    lines += [f"rank {r} proxy: channel {p['channel']} {p['dir']} rank {p['peer']} {p['proto']} steps "
              f"{p['base']}+{p['nsteps']}: posted {p['posted']} transmitted {p['transmitted']} received "
              f"{p['received']} done {p['done']}" + (f" ({p['queued_ops']} ops queued)" if p['queued_ops'] > 1 else "")
              for r, rep in sorted(reports.items()) for p in rep.get("proxy", [])]
    mismatch = mismatch_verdict(reports)
    if mismatch:  # the waits are the mismatch's echo: a rank missing from them only found it first
        return {**mismatch, "waits": lines}
    if silent:
        culprit = silent[0]
        who = [r for r, p, _ in waits if p == culprit]
        reason = (f"rank {culprit} caused the hang: ranks {sorted(set(who))} wait for it, and it is not waiting "
                  f"inside the collective (it never entered it, is stuck elsewhere, or died)")
    else:
        behind = min(reports.values(), key=lambda rep: rep["op_count"])
        if behind["op_count"] < max(rep["op_count"] for rep in reports.values()):
            culprit = behind["rank"]
            reason = f"rank {culprit} is behind (opCount {behind['op_count']}): the others wait for it"
        else:
            culprit = None
            reason = (f"all {len(reports)} of {nranks} ranks wait on each other in a cycle: the calls do not "
                      f"match (different counts, types or collectives)")
    return {"culprit": culprit, "kind": "hang", "reason": reason, "waits": lines}
