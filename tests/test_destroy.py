"""``destroy()`` gives everything back at once (NCCL ``ncclCommDestroy`` → ``commFree``): 50 communicators created
and destroyed in one process, with the cycle collector off, leave its descriptors, its /dev/shm mappings and its
threads where they were after the first few; and a call after ``destroy`` is one line, not a traceback.  Two
ranks on one node (SHM), on two emulated nodes (NET: proxy thread, plugin comms and their helper threads, listen
sockets), and with LL (the compiled LL cache).  Before the fix, with SHM: 14 descriptors and 10 mappings after the
first cycle, 504 and 500 (1.8 GiB) after the 50th."""
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, spawn_code

CYCLES = 50


def run_cycles(nodes: int = 1, env: dict | None = None) -> list[dict]:
    """Two ranks of ``destroy_workers.py cycles``; each rank's JSON line."""
    full_env = {**os.environ, "NCCLLAB_TIMEOUT": "30", "NCCL_SOCKET_IFNAME": "lo", **(env or {})}
    code = spawn_code(2, f"[{str(ROOT / 'tests' / 'destroy_workers.py')!r}, *sys.argv[1:]]", nodes)
    proc = subprocess.run([sys.executable, "-c", code, "cycles", str(CYCLES)], env=full_env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, f"ranks failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("nodes, env", [(1, {}), (2, {"NCCL_SOCKET_NTHREADS": "2"}), (1, {"NCCL_PROTO": "LL"})],
                         ids=["shm", "net-2-nodes", "ll"])  # NET with the socket plugin's helper threads
def test_destroy_frees_everything(nodes, env):
    ranks = run_cycles(nodes, env)
    assert len(ranks) == 2, ranks
    for r in ranks:
        early, late = r["rows"][4], r["rows"][-1]
        grown = {k: late[k] - early[k] for k in ("fds", "maps", "threads")}
        assert all(v <= 0 for v in grown.values()), (
            f"rank {r['rank']}: after cycle 5 {early}, after cycle {CYCLES} {late}: destroy left {grown} behind")
        assert r["after"] == "RuntimeError: communicator was destroyed", r["after"]
