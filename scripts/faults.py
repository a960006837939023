"""The fault suite with its figures: every fault of ``tests/faults.py`` under mpirun and under our own launcher,
as a table (time to detection, time for the whole job to end, exit code, the culprit-naming line, what was
left in ``/dev/shm`` and in the process table).

    python scripts/faults.py [--launcher mpirun|spawn|both] [--repeat N]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from faults import FAULTS, MPIRUN, run_fault  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launcher", choices=["mpirun", "spawn", "both"], default="both",
                   help="which launcher to run the jobs under (default both)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each fault (default 1)")
    a = p.parse_args()
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
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
