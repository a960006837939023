"""The communicator initializes as NCCL's ``initTransportsRank`` does: every rank loads its node's topology
(``NCCL_TOPO_FILE``, the runners' ``--topo``, or the CPU lab's own), searches, all-gathers the graph info, runs
Preset and Postset; its own ``Channel``, ``Ring``, ``Tree`` and ``Trees`` lines equal the search's
(``collectives.tools.topology``).  ``NCCL_GRAPH_FILE`` / ``NCCL_GRAPH_DUMP_FILE`` read and write the graphs."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from collectives.graph.connect import channel_lines, rank_lines, tree_lines
from collectives.graph.init_cluster import run_cluster
from collectives.graph.init_topo import run_topology
from collectives.graph.topo_xml import StandIns
from conftest import ROOT
from test_topo_lab import square
from visualize import nccl_tests

ENV = {**os.environ, "NCCLLAB_TIMEOUT": "90", "NCCL_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "INFO",
       "NCCL_DEBUG_SUBSYS": "INIT,GRAPH"}
NDV5 = ROOT / "topologies" / "azure-ndv5-topo.xml"
SMALL = ["-b", "4K", "-e", "64K", "-f", "16", "-n", "1", "-w", "0"]
LINE = re.compile(r"\[(\d+)\] NCCL INFO ((?:Channel \d\d/\d\d :(?: +\d+)+(?:\.\.\.)?|Ring \d\d : .*|Trees .*|"
                  r"Tree \d+ : .*))$", re.M)


def comm_lines(log: str) -> dict:
    """The communicator's ring and tree lines: rank 0's Channel lines, every rank's Ring, Tree and Trees lines
    (each list in the order the rank printed them)."""
    out: dict = {}
    for local, line in LINE.findall(log):
        out.setdefault(line.split()[0], []).append(line)
    for key in out:
        if key != "Channel":
            out[key] = sorted(out[key])
    return out


def search_lines(channels_of_rank, nranks: int) -> dict:
    """The same lines from the search (what ``collectives.tools.topology`` prints)."""
    out = {"Channel": channel_lines(channels_of_rank(0)), "Ring": [], "Tree": [], "Trees": []}
    for rank in range(nranks):
        out["Tree"] += tree_lines(channels_of_rank(rank), rank)
        for line in rank_lines(channels_of_rank(rank), rank):
            out[line.split()[0]].append(line)
    return {k: sorted(v) if k != "Channel" else v for k, v in out.items() if v}


def run(module: str, args: list, env: dict, timeout: float = 400) -> subprocess.CompletedProcess:
    small = SMALL[2:] if "-b" in args else SMALL
    proc = subprocess.run([sys.executable, "-m", module, *args, *small], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    t = nccl_tests.parse(proc.stdout)[0]
    assert t.rows and all(r.out_of_place["wrong"] == 0 and r.in_place["wrong"] == 0 for r in t.rows)
    return proc


def test_nccl_topo_file_one_node_lines_equal_the_search(tmp_path):
    """NCCL_TOPO_FILE alone (no --topo): every rank loads the file, searches and runs Postset itself."""
    xml = square(tmp_path)
    r = run_topology(str(xml), stand=StandIns(nics=False))
    proc = run("collectives.ring", ["-g", "4"], {**ENV, "NCCL_TOPO_FILE": str(xml)})
    got = comm_lines(proc.stdout + proc.stderr)
    assert got == search_lines(lambda rank: r.channels, 4)
    assert got["Channel"][0].startswith("Channel 00/") and " 0 1 2 3" not in got["Channel"][0]


def test_nccl_topo_file_two_nodes_lines_equal_the_search():
    """Two emulated NDv5 nodes of 2 GPUs: each rank searches its node (NETs at the channels' ends), the graph
    info crosses the bootstrap, each rank's own Postset; the lines equal ``topology --nodes 2 --nranks 2``'s."""
    c = run_cluster(str(NDV5), 2, 2, StandIns(sm=90))
    proc = run("collectives.ring", ["-g", "4", "--nodes", "2"],
               {**ENV, "NCCL_TOPO_FILE": str(NDV5), "NCCLLAB_TOPO_SM": "90"})
    assert comm_lines(proc.stdout + proc.stderr) == search_lines(lambda rank: c.channels[rank], 4)


def test_cpu_lab_without_topology_keeps_rank_order(tmp_path):
    """No topology: the CPU lab's own node (its ranks as devices), one search channel in rank order, doubled."""
    proc = run("collectives.ring", ["-g", "4", "--nodes", "2"], ENV)
    got = comm_lines(proc.stdout + proc.stderr)
    assert got["Channel"] == ["Channel 00/02 : 0 1 2 3", "Channel 01/02 : 0 1 2 3"]
    assert "Trees [0] 1/2/-1->0->-1 [1] 1/-1/-1->0->2" in got["Trees"]


def cluster_lines(nodes: int, local: int) -> dict:
    c = run_cluster(str(NDV5), nodes, local, StandIns(sm=90))
    return search_lines(lambda rank: c.channels[rank], nodes * local)


def test_ring_runner_16_ranks_on_two_ndv5_nodes_over_sockets():
    """The issue's command: 2 emulated NDv5 nodes of 8 GPUs, bitwise, with exactly the search's channels."""
    proc = run("collectives.ring", ["-g", "16", "--nodes", "2", "--topo", str(NDV5), "--sm", "90", "-b", "1K"],
               {**ENV, "NCCL_NET": "Socket", "NCCLLAB_TIMEOUT": "240"}, timeout=600)
    got = comm_lines(proc.stdout + proc.stderr)
    assert got == cluster_lines(2, 8)
    assert len(got["Channel"]) == 16 and len(got["Ring"]) == 16 * 16


def test_tree_runner_on_two_nodes_over_ib():
    """The tree runner over the IB transport (the software verbs provider where no RDMA device exists)."""
    proc = run("collectives.tree", ["-g", "4", "--nodes", "2", "--topo", str(NDV5), "--sm", "90"],
               {**ENV, "NCCL_NET": "IB", "NCCLLAB_VERBS": os.environ.get("NCCLLAB_VERBS", "auto"),
                "NCCL_DEBUG_SUBSYS": "INIT,GRAPH,NET"})
    log = proc.stdout + proc.stderr
    assert comm_lines(log) == cluster_lines(2, 2)
    assert "via NET/IB" in log
    c = run_cluster(str(NDV5), 2, 2, StandIns(sm=90))
    for ch in range(c.aligned[0].n_channels):      # the search's NICs, said by the rank the ring enters at
        ends = c.nodes[1].ring.inter[ch]
        assert re.search(rf"\[\d\] NCCL INFO Channel {ch:02d} : the search's ring enters this node at "
                         rf"NET/{ends[0]} and leaves at NET/{ends[1]}; NET/IB opens each on its own device", log), ch


MPIRUN = shutil.which("mpirun", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))


@pytest.mark.skipif(MPIRUN is None, reason="mpirun not installed")
def test_topo_under_mpirun_with_per_rank_hostids():
    """mpirun's ranks, each node's NCCL_HOSTID given per rank (MPMD ``:``); every rank searches its own node."""
    cmd = [sys.executable, "-m", "collectives.ring", "--topo", str(NDV5), "--sm", "90", *SMALL]
    proc = subprocess.run([MPIRUN, "-n", "2", "-env", "NCCL_HOSTID", "nodeA", *cmd, ":", "-n", "2", "-env",
                           "NCCL_HOSTID", "nodeB", *cmd], env=ENV, capture_output=True, text=True, timeout=400,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    t = nccl_tests.parse(proc.stdout)[0]
    assert t.rows and all(r.out_of_place["wrong"] == 0 and r.in_place["wrong"] == 0 for r in t.rows)
    assert comm_lines(proc.stdout + proc.stderr) == cluster_lines(2, 2)
