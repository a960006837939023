"""The fault suite with its figures: every fault of ``tests/faults.py`` under mpirun and under our own launcher,
as a table (time to detection, time for the whole job to end, exit code, the culprit-naming line, what was
left in ``/dev/shm`` and in the process table).

    python scripts/faults.py [--launcher mpirun|spawn|both] [--repeat N] [--strangers-only]

Then the strangers (``tests/strangers.py``): every kind connected before the real peer to the bootstrap root, the
bootstrap ring and the NET listeners (socket and IB plugins), with how long each listener took to drop it and
how the job ended.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import tempfile  # noqa: E402

import strangers  # noqa: E402
from faults import FAULTS, MPIRUN, run_fault  # noqa: E402


def strangers_table() -> int:
    """One row per listener: for each stranger kind the longest time the listener took to drop it (over every
    listener of that kind in the job), then the job's outcome and time."""
    kinds = strangers.KINDS
    print("\nStrangers connected before the real peer (each cell: the longest time from its connect until the "
          "listener dropped it; `reply` if a stranger ever got one):\n")
    print("| listener | job | " + " | ".join(kinds) + " | job outcome | job time | code ran |")
    print("|---|---|" + "---|" * len(kinds) + "---|---|---|")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for sc in (strangers.root_scenario(Path(tmp)), strangers.net_scenario(Path(tmp), "Socket"),
                   strangers.net_scenario(Path(tmp), "IB")):
            bad += not sc.ok or sc.code_ran
            for where in sorted({w for w, _, _ in sc.drops}):
                cells = []
                for kind in kinds:
                    times = [t for w, k, t in sc.drops if w == where and k == kind]
                    bad += not times or None in times
                    cells.append("not seen" if not times else "reply" if None in times else f"{max(times):.3f} s")
                print(f"| {where} | {sc.where} | " + " | ".join(cells) + f" | {'completed, bitwise right' if sc.ok else 'FAILED'}"
                      f" | {sc.seconds:.1f} s | {'YES' if sc.code_ran else 'no'} |", flush=True)
    return bad


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launcher", choices=["mpirun", "spawn", "both"], default="both",
                   help="which launcher to run the jobs under (default both)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each fault (default 1)")
    p.add_argument("--strangers-only", action="store_true", help="only the strangers' table")
    a = p.parse_args()
    if a.strangers_only:
        return 1 if strangers_table() else 0
    launchers = ["mpirun", "spawn"] if a.launcher == "both" else [a.launcher]
    if "mpirun" in launchers and MPIRUN is None:
        sys.exit("faults.py: mpirun not found (pip install mpich)")
    print("Times from the fault (or the start, for faults at init): when the first rank reported it, and when the "
          "last process of the job had ended.\n")
    print("| fault | launcher | detected after | job ended after | exit code | left in /dev/shm | left running | "
          "message |\n|---|---|---|---|---|---|---|---|")
    bad = 0
    for kind in FAULTS:
        for launcher in launchers:
            if launcher == "spawn" and kind == "port_taken":
                continue
            for _ in range(a.repeat):
                r = run_fault(kind, launcher)
                ok = r.returncode != 0 and r.message and not r.left_shm and not r.left_procs
                bad += not ok
                det = f"{r.detect_s:.3f} s" if r.detect_s is not None else "-"
                print(f"| {kind} | {launcher} | {det} | {r.ended_s:.1f} s | {r.returncode} | "
                      f"{len(r.left_shm)} | {len(r.left_procs)} | {r.message[:150]} |", flush=True)
    bad += strangers_table()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
