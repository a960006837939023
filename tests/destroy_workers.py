"""Rank programs for tests/test_destroy.py: ``destroy_workers.py NAME [args]``, one process per rank.

``cycles N``: create and destroy N communicators in a row with the cycle collector off, so that only ``destroy``
itself can give back what a communicator took (NCCL's ``ncclCommDestroy`` → ``commFree`` frees every resource at
once; nothing waits for a garbage collector).  After each cycle it counts this process's open descriptors, its
mappings of ``/dev/shm`` and its threads, and prints them as one JSON line.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import threading

import numpy as np

import collectives


def resources() -> dict:
    """Open descriptors, mappings of /dev/shm (count and bytes) and live threads of this process."""
    maps, shm_bytes = 0, 0
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                lo, hi = (int(v, 16) for v in fields[0].split("-"))
                maps += 1
                shm_bytes += hi - lo
    return {"fds": len(os.listdir("/proc/self/fd")), "maps": maps, "shm_mib": round(shm_bytes / 2**20, 1),
            "threads": threading.active_count()}


def cycles(args: list[str]) -> None:
    n = int(args[0])
    gc.disable()  # what destroy leaves behind stays behind: no cycle collector cleans up after it
    x = np.arange(4096, dtype=np.float32)
    rows = []
    for i in range(n):
        comm = collectives.Communicator()
        y = comm.all_reduce(x)  # every connection carries data once (NET: the proxy thread and its sockets)
        comm.all_reduce(x[:16])  # a small call: LL where the cost model picks it, the compiled LL cache
        assert np.array_equal(y, x * comm.nranks), f"rank {comm.rank}: cycle {i}: wrong AllReduce"
        comm.destroy()
        rows.append(resources())
        del comm, y
    try:
        comm = collectives.Communicator()
        comm.destroy()
        comm.barrier()
        after = "barrier after destroy did not raise"
    except Exception as exc:  # anything else than the one line is a failure the test shows
        after = f"{type(exc).__name__}: {exc}"
    sys.stdout.write(json.dumps({"rank": int(os.environ["NCCLLAB_RANK"]), "rows": rows, "after": after}) + "\n")
    sys.stdout.flush()  # one write: ranks share the pipe


if __name__ == "__main__":
    globals()[sys.argv[1]](sys.argv[2:])
