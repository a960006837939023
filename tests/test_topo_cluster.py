"""NCCL's multi-node topology search (collectives.graph.init_cluster, ``--nodes K``): the shared multi-node fixtures
line for line, and rules of NCCL's inter-node search on cases the fixtures do not show."""
import functools
import re

import pytest

from collectives.graph.init_cluster import run_cluster
from collectives.graph.topo_xml import StandIns
from collectives.graph.trees import get_dtree
from collectives.tools.topology import render_cluster
from conftest import FIXTURES, ROOT

TOPO = FIXTURES / "topo"
SKIP_LOADER = ("Loading", "Filled", "NVLink target", "TOPO/NET")  # harness paths and plugin chatter differ
CASES = [("ndv4-x2.oracle.txt", ROOT / "topologies" / "azure-ndv4-topo.xml", 2, None,
          (("sm", 80), ("nic_speed", 200000))),     # the fixture's plugin reports HDR NICs
         ("ndv5-1gpu-x4.oracle.txt", TOPO / "ndv5-topo.azure.xml", 4, 1, (("sm", 90),))]


@functools.lru_cache(maxsize=None)
def cluster(xml, nodes, nranks, stand):
    """One run per case (a 2 x 8 search takes tens of seconds here)."""
    return run_cluster(str(xml), nodes, nranks, StandIns(**dict(stand)))


def oracle(name: str) -> list[str]:
    return (TOPO / name).read_text().splitlines()


def info_lines(lines: list[str]) -> list[str]:
    return [line for line in lines if " NCCL INFO " in line and not any(s in line for s in SKIP_LOADER)]


@pytest.mark.parametrize("name,xml,nodes,nranks,stand", CASES)
def test_every_info_line_equal(name, xml, nodes, nranks, stand):
    if not TOPO.exists():
        pytest.skip("shared topology fixtures absent")
    r = cluster(xml, nodes, nranks, stand)
    ours = info_lines(render_cluster(r))
    expected = info_lines(oracle(name))
    assert len(expected) > 100
    assert ours == expected


@pytest.mark.parametrize("name,xml,nodes,nranks,stand", CASES)
def test_oracle_summary_rings_and_trees(name, xml, nodes, nranks, stand):
    """The harness's ``ORACLE ring N order`` and ``ORACLE tree N up`` lines, from rank 0's channels."""
    if not TOPO.exists():
        pytest.skip("shared topology fixtures absent")
    r = cluster(xml, nodes, nranks, stand)
    ch = r.channels[0]
    nr = r.nranks
    ours = []
    for c, order in enumerate(ch.rings):
        i = order.index(0)
        ours.append(f"ORACLE ring {c:2d} order: " + " ".join(str(x) for x in order[i:] + order[:i]))
    for c in range(ch.n):
        ups = [r.channels[k].trees()[c][k].up for k in range(nr)]
        ours.append(f"ORACLE tree {c:2d} up: " + " ".join(str(u) for u in ups))
    expected = [line for line in oracle(name) if re.match(r"ORACLE (ring +\d+ order|tree +\d+ up):", line)]
    assert sorted(ours) == sorted(expected) and len(expected) >= 8


def ndv5_one_gpu():
    return TOPO / "ndv5-topo.azure.xml"


def test_three_nodes_one_gpu_follow_ncclGetDtree():
    """Three one-GPU nodes (no fixture): rings 0 1 2, and each channel's trees are ncclGetDtree's over 3 nodes
    (tree 1 shifted by one, odd count), for channel c < n tree 0 and c + n tree 1."""
    if not TOPO.exists():
        pytest.skip("shared topology fixtures absent")
    r = run_cluster(str(ndv5_one_gpu()), 3, 1, StandIns(sm=90))
    assert r.rings[0].n_channels == 2 and r.trees[0].pattern == 3
    for rank in range(3):
        ch = r.channels[rank]
        assert all(order == [0, 1, 2] for order in ch.rings)
        n = ch.n // 2
        t0, t1 = get_dtree(3, rank)
        for c in range(ch.n):
            up, d0, d1, _ = t0 if c < n else t1
            node = ch.trees()[c][rank]
            assert node.up == up and list(node.down) == [d for d in (d0, d1) if d != -1]


def test_cross_nic_env_changes_the_ring(monkeypatch):
    """NCCL_CROSS_NIC=0 keeps every ring channel on one NIC (same asic/port out and back); =1 marks the graph
    crossNic 1 (ncclTopoCompute), which the Pattern line shows."""
    if not TOPO.exists():
        pytest.skip("shared topology fixtures absent")
    monkeypatch.setenv("NCCL_CROSS_NIC", "0")
    r0 = run_cluster(str(ndv5_one_gpu()), 2, 2, StandIns(sm=90))
    ring = r0.rings[0]
    assert ring.cross_nic == 0 and ring.n_channels >= 1
    assert all(ring.inter[c][0] == ring.inter[c][1] for c in range(ring.n_channels))
    monkeypatch.setenv("NCCL_CROSS_NIC", "1")
    r1 = run_cluster(str(ndv5_one_gpu()), 2, 2, StandIns(sm=90))
    assert r1.rings[0].cross_nic == 1
    assert any(line.startswith("node0 [0] NCCL INFO Pattern 4, crossNic 1,") for line in render_cluster(r1))
