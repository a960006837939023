"""NCCL's multi-node topology search (collectives.graph.init_cluster, ``--nodes K``): the shared multi-node fixtures
line for line, and rules of NCCL's inter-node search on cases the fixtures do not show."""
import functools
import re

import pytest

from collectives.graph.connect import TopoRanks, postset_rank
from collectives.graph.init_cluster import run_cluster
from collectives.graph.search import PATTERN_NAMES, net_name
from collectives.graph.topo import PATH_TYPES
from collectives.graph.topo_xml import StandIns
from collectives.graph.trees import get_dtree
from collectives.tools.topology import render_cluster
from conftest import FIXTURES, ROOT

TOPO = FIXTURES / "topo"
CONNECTION = re.compile(r"INFO (Channel \d\d(/0)? : \d+\[\d+\] -> |Connected all )")
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
    # the harness runs no transport setup: our connection lines (tests/test_topo_net_lines.py) are left out
    ours = [line for line in info_lines(render_cluster(r)) if not CONNECTION.search(line)]
    expected = info_lines(oracle(name))
    assert len(expected) > 100
    assert ours == expected


def summary_lines(r) -> list[str]:
    """The harness's summary (``ORACLE`` lines after ``===== summary =====``) from our result, but the nested
    trees and the consistency checks: node 0's graphs, the alignment, the channel counts, ring orders, tree ups."""
    out = []
    for name, g in (("RING", r.rings[0]), ("TREE", r.trees[0])):
        out.append(f"ORACLE {name} graph: id {g.id} pattern {g.pattern} ({PATTERN_NAMES[g.pattern]}) crossNic "
                   f"{g.cross_nic} nChannels {g.n_channels} bwIntra {g.bw_intra:.2f} bwInter {g.bw_inter:.2f} "
                   f"typeIntra {PATH_TYPES[g.type_intra]} typeInter {PATH_TYPES[g.type_inter]} "
                   f"sameChannels {g.same_channels}")
        for c in range(g.n_channels):
            ranks = " ".join(str(x) for x in g.intra[c][:r.local_ranks])
            out.append(f"ORACLE {name} channel {c:2d} ranks: {ranks} nets: {net_name(g.inter[c][0])} "
                       f"{net_name(g.inter[c][1])}")
    ring, tree = r.aligned
    n = min(ring.n_channels, tree.n_channels)
    patterns = " ".join(str(t.pattern) for t in r.trees)
    out.append(f"ORACLE aligned across ranks: nChannels {n} bwIntra {ring.bw_intra:.2f} bwInter "
               f"{ring.bw_inter:.2f} typeIntra {PATH_TYPES[ring.type_intra]} typeInter "
               f"{PATH_TYPES[ring.type_inter]} crossNic {ring.cross_nic} (RING); tree pattern per node: {patterns}")
    ch = r.channels[0]
    out.append(f"ORACLE nNodes {len(r.nodes)}; channels before Postset {n}; after Postset (ring/tree doubled, "
               f"NCCL_MIN/MAX_CTAS applied) {ch.n}")
    for c, order in enumerate(ch.rings):
        i = order.index(0)
        out.append(f"ORACLE ring {c:2d} order: " + " ".join(str(x) for x in order[i:] + order[:i]))
    for c in range(ch.n):
        ups = [r.channels[k].trees()[c][k].up for k in range(r.nranks)]
        out.append(f"ORACLE tree {c:2d} up: " + " ".join(str(u) for u in ups))
    return out


@pytest.mark.parametrize("name,xml,nodes,nranks,stand", CASES)
def test_oracle_summary_lines(name, xml, nodes, nranks, stand):
    """The ORACLE summary lines the fixture has, the nested trees and checks aside (every rank's ``up`` per
    tree is compared instead, from that rank's own Postset)."""
    if not TOPO.exists():
        pytest.skip("shared topology fixtures absent")
    r = cluster(xml, nodes, nranks, stand)
    lines = oracle(name)
    start = lines.index("ORACLE ===== summary =====")
    expected = [line for line in lines[start:] if re.match(
        r"ORACLE ((RING|TREE) (graph|channel)|aligned|nNodes|ring +\d+ order|tree +\d+ up)", line)]
    assert len(expected) > 10
    assert summary_lines(r) == expected


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


def test_cross_nic_2_swaps_odd_nodes_on_each_ranks_own_copy():
    """ncclTopoPostset with crossNicRing 2: an odd node's channel pairs (0,1), (2,3), ... swap, so node 1 rides
    channel 0 on its channel-1 chain; every rank swaps its own copy, so running it for rank after rank on the
    same all-gathered data gives the same rings (a shared copy swapped twice would undo the swap)."""
    def ranks(chains, rank, cross):
        t = TopoRanks(*([-1] * 2 for _ in range(7)), cross_nic_ring=cross)
        for c, chain in enumerate(chains):
            i = chain.index(rank)
            t.ring_recv[c], t.ring_send[c] = chain[0], chain[-1]
            t.ring_prev[c] = chain[i - 1] if i else -1
            t.ring_next[c] = chain[i + 1] if i < len(chain) - 1 else -1
            t.tree_to_parent[c] = t.tree_to_child0[c] = t.tree_to_child1[c] = chain[0]
        return t
    node0, node1 = [[0, 1], [1, 0]], [[2, 3], [3, 2]]
    for cross, ring0 in ((2, [0, 1, 3, 2]), (0, [0, 1, 2, 3])):
        data = [ranks(node0, r, cross) for r in (0, 1)] + [ranks(node1, r, cross) for r in (2, 3)]
        chains = [[0, 1, 2, 3], [1, 0, 3, 2]]
        results = [postset_rank(r, 2, data, [0, 2], [0, 0, 1, 1], chains, ["TREE", "TREE"]) for r in range(4)]
        for ch in results:
            assert ch.rings[0] == ring0 and ch.rings[2] == ring0 and ch.n == 4
        assert data[2].ring_recv == [2, 3]        # the all-gathered data itself is left as it was


def test_hopper_across_nodes_doubles_again_above_45():
    """ncclTopoPostset: with minCompCap >= 90, more than one node and a ring bwIntra above 45 GB/s, channels are
    copied once more (below 16): 2 search channels -> 4 after Postset -> 8; not at exactly 45, nor on sm80."""
    def ranks(chain, rank):
        i = chain.index(rank)
        t = TopoRanks(*([-1] * 2 for _ in range(7)), cross_nic_ring=0)
        for c in range(2):
            t.ring_recv[c], t.ring_send[c] = chain[0], chain[-1]
            t.ring_prev[c] = chain[i - 1] if i else -1
            t.ring_next[c] = chain[i + 1] if i < len(chain) - 1 else -1
            t.tree_to_parent[c] = t.tree_to_child0[c] = t.tree_to_child1[c] = chain[0]
        return t
    data = [ranks([0, 1], 0), ranks([0, 1], 1), ranks([2, 3], 2), ranks([2, 3], 3)]
    chains = [[0, 1, 2, 3], [0, 1, 2, 3]]

    def count(cc, bw):
        return postset_rank(0, 2, data, [0, 2], [0, 0, 1, 1], chains, ["TREE", "TREE"], cc, bw).n
    assert (count(90, 48.0), count(90, 45.0), count(80, 48.0)) == (8, 4, 4)
