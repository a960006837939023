"""Rank programs for the point-to-point tests: ``p2p_workers.py NAME [args]``, one process per rank."""
from __future__ import annotations

import sys

import collectives


def p2p_schedule(args: list[str]) -> None:
    """Print this rank's ``Communicator.p2p_schedule()``."""
    with collectives.Communicator() as comm:
        sys.stdout.write(f"schedule {comm.rank} {comm.p2p_schedule()!r}\n")  # one write: ranks share the pipe
        sys.stdout.flush()


if __name__ == "__main__":
    globals()[sys.argv[1]](sys.argv[2:])
