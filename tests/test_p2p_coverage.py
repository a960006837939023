"""The acceptance's remaining configurations for point-to-point, one multi-process run each: 8 ranks on 2 emulated
nodes (SHM inside a node, NET/Socket between), and 4 ranks on 2 nodes over NET/IB on the software verbs provider;
each run checks bitwise every send/recv pair, all-to-all, gather and scatter at every root, and 8 AllReduces in
one group against separate calls (``p2p_workers.coverage``)."""
import os

import pytest

from conftest import run_ranks

IB = {"NCCL_NET": "IB", "NCCLLAB_VERBS": os.environ.get("NCCLLAB_VERBS", "auto"), "NCCLLAB_TIMEOUT": "60"}


@pytest.mark.parametrize("n,env", [(8, {}), (4, IB)], ids=["8-ranks-socket", "4-ranks-ib"])
def test_point_to_point_bitwise(n, env):
    proc = run_ranks(n, "coverage", nodes=2, env={**env, "NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "NET"},
                     script="p2p_workers.py", timeout=600)
    out = proc.stdout + proc.stderr
    ends = [line.split(" ok ", 1)[1] for line in proc.stdout.splitlines() if line.startswith("rank ") and " ok " in line]
    for what in (f"{3 * n} receives", "alltoall", "rooted", "group_colls"):  # every source, 3 counts
        assert ends.count(what) == n, (what, ends, proc.stdout[-3000:])
    assert ("via NET/IB" if env else "via NET/Socket") in out, out[-2000:]
