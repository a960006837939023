"""Hang diagnosis: a report per stuck rank, and a merge that names the rank that caused the hang.

When a rank's wait passes its deadline (or a peer's abort reaches it), it writes ``hang-rank<r>.json`` with
what every channel was waiting for: the collective and opCount, the primitive, the step and FIFO slot, the peer,
and the counter (tail, head, LL/LL128 flag), plus its last trace events when tracing is on.
``diagnose`` builds the wait-for graph: a rank that others wait for but that wrote no report never entered the
collective, died, or is stuck outside it; if every rank is waiting, the one furthest behind (lowest opCount)
is the cause; otherwise it is a cycle (mismatched calls).
Reports go to ``NCCLLAB_HANG_DIR``, else the trace directory, else ``$TMPDIR/nccllab-hangs/<comm tag>``; the
rank prints the path.  Only the newest ``KEEP`` runs are kept under ``$TMPDIR/nccllab-hangs``.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile


KEEP = 20


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


def diagnose(directory: str) -> dict:
    """{'culprit': rank or None, 'reason': text, 'waits': [...]}."""
    reports = load_reports(directory)
    if not reports:
        return {"culprit": None, "reason": f"no hang reports in {directory}", "waits": []}
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
    return {"culprit": culprit, "reason": reason, "waits": lines}
