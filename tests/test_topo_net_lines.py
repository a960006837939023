"""The transport, NIC and proxy of every ring and tree connection across nodes (collectives.graph.transport_select),
printed as NCCL's transport setup prints them: a real 3-node log line for line, and on other machines NCCL's rules
rewritten here (the NIC from the graph's inter[] ends, PXN through the NIC's own GPU, GDR, P2P/SHM inside a node,
each connection once, in ncclTransportP2pSetup's order)."""
import functools
import re

import pytest

from collectives.graph.init_cluster import cluster_connections, run_cluster
from collectives.graph.topo import GPU, NET, PATH_PIX, PATH_PXN
from collectives.graph.topo_xml import StandIns
from collectives.tools.topology import main
from conftest import FIXTURES, ROOT

NDV5 = ROOT / "topologies" / "azure-ndv5-topo.xml"
NDV4 = ROOT / "topologies" / "azure-ndv4-topo.xml"
LINE = re.compile(r"Channel (\d\d)(/0)? : (\d+)\[(\d+)\] -> (\d+)\[(\d+)\] (\[send\] |\[receive\] )?via (\S+)$")

# 1 x P40 and one Soft-RoCE NIC without GPUDirect, as in the rdma_ib_tutorial log (NCCL 2.20.5, 3 nodes)
P40_XML = """<system version="1">
  <cpu numaid="0" affinity="ffffffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="79">
    <pci busid="0000:02:00.0" class="0x030200" vendor="0x10de" device="0x1b38" subsystem_vendor="0x10de"
         subsystem_device="0x11d9" link_speed="8.0 GT/s PCIe" link_width="16">
      <gpu dev="0" sm="61" rank="0" gdr="1"/>
    </pci>
    <pci busid="0000:03:00.0" class="0x020000" vendor="0x8086" device="0x1572" subsystem_vendor="0x8086"
         subsystem_device="0x0000" link_speed="8.0 GT/s PCIe" link_width="8">
      <nic><net name="rxe0" dev="0" speed="10000" port="1" latency="0.000000" guid="0x1" maxconn="131072" gdr="0"/></nic>
    </pci>
  </cpu>
</system>
"""


def test_three_p40_nodes_line_for_line(tmp_path, monkeypatch):
    """Every node's connection lines of the real 3 x 1 P40 log (NCCL_MAX_NCHANNELS=1), in its order."""
    log = FIXTURES / "nccl_logs" / "rdmatutorial_3x1_p40_graph.log"
    if not log.exists():
        pytest.skip("shared NCCL log fixtures absent")
    xml = tmp_path / "p40.xml"
    xml.write_text(P40_XML)
    monkeypatch.setenv("NCCL_MAX_NCHANNELS", "1")
    r = run_cluster(str(xml), 3, 1, StandIns())
    ours = cluster_connections(r)
    for rank in range(3):
        expected = [line.split(" NCCL INFO ")[1] for line in log.read_text().splitlines()
                    if line.startswith(f"node{rank}:") and LINE.search(line)]
        assert len(expected) >= 3
        assert [x for x in ours[rank] if LINE.match(x)] == expected


@functools.lru_cache(maxsize=None)
def cluster(xml, sm, nranks):
    """One run per machine shape (environment left as is)."""
    return run_cluster(str(xml), 2, nranks, StandIns(sm=sm))


def parse(lines):
    """(channel, src, dst, kind, via) of every connection line; kind send/receive for NET, p2p/shm inside."""
    out = []
    for line in lines:
        m = LINE.match(line)
        if m:
            kind = (m.group(7) or "").strip(" []") or ("shm" if m.group(2) is None else "p2p")
            out.append((int(m.group(1)), int(m.group(3)), int(m.group(5)), kind, m.group(8)))
    return out


def check_rank(r, rank, lines, graph_of, edges, gdr=True):
    """Every NET line of ``rank`` names the NIC NCCL's rule gives (channel c mod the search's channels of the
    rank's own node graph; the channel's first GPU takes the NIC the channel starts at, any other GPU its end)
    and the proxy PXN requires; each expected edge once."""
    res = r.nodes[r.node_of[rank]]
    system = res.system
    seen = set()
    for c, src, dst, kind, via in parse(lines):
        key = (c, src, dst, kind)
        assert key not in seen, f"connection printed twice: {key}"
        seen.add(key)
        me = src if kind == "send" or kind in ("p2p", "shm") else dst
        assert me == rank
        if kind in ("p2p", "shm"):
            assert r.node_of[src] == r.node_of[dst]
            continue
        graph = graph_of(res)
        cc = c % r.channels[rank].search_channels
        end = 0 if graph.intra[cc][0] == rank else 1
        net = next(x for x in system.nodes[NET] if x.id == graph.inter[cc][end])
        m = re.match(r"NET/IB/(\d+)(\((\d+)\))?(/GDRDMA)?$", via)
        assert m, via
        assert int(m.group(1)) == net.dev
        me_gpu = next(g for g in system.nodes[GPU] if g.rank == rank)
        n = system.nodes[NET].index(net)
        if kind == "send" and me_gpu.paths[NET][n].type == PATH_PXN:
            proxy = int(m.group(3))
            assert proxy != rank and r.node_of[proxy] == r.node_of[rank]
            proxy_gpu = next(g for g in system.nodes[GPU] if g.rank == proxy)
            assert proxy_gpu.paths[NET][n].type <= PATH_PIX      # the NIC's own GPU relays
        else:
            assert m.group(2) is None
        assert bool(m.group(4)) == gdr
    assert {(c, s, d) for c, s, d, _, _ in parse(lines)} == edges


def ring_edges(r, rank):
    """Rank's ring connections by NCCL's rule: receive from prev, send to next, every channel."""
    out = set()
    for c, order in enumerate(r.channels[rank].rings):
        i = order.index(rank)
        prev, nxt = order[i - 1], order[(i + 1) % len(order)]
        if r.node_of[prev] != r.node_of[rank]:
            out.add((c, prev, rank))            # only NET receives print
        out.add((c, rank, nxt))
    return out


def tree_edges(r, rank, ring):
    """Rank's tree connections not already made by the ring on that channel and direction."""
    out = set()
    done = {(c, s, d) for c, order in enumerate(r.channels[rank].rings)
            for s, d in ((order[order.index(rank) - 1], rank), (rank, order[(order.index(rank) + 1) % len(order)]))}
    for c, tree in enumerate(r.channels[rank].trees()):
        t = tree[rank]
        peers_in = list(t.down) + ([t.up] if t.up != -1 else [])
        for p in peers_in:
            if (c, p, rank) not in done and r.node_of[p] != r.node_of[rank]:
                out.add((c, p, rank))
            if (c, rank, p) not in done:
                out.add((c, rank, p))
    return out


def split(lines):
    i = lines.index(next(x for x in lines if x.startswith("Connected all rings")))
    return lines[:i], lines[i + 1:-1], lines[i]


@pytest.mark.parametrize("xml,sm,nranks", [(NDV5, 90, 2), (NDV4, 80, 2), (NDV4, 80, 4)])
def test_nic_and_proxy_follow_the_graph(xml, sm, nranks):
    r = cluster(xml, sm, nranks)
    conns = cluster_connections(r)
    pxn = False
    for rank in range(r.nranks):
        ring, tree, done = split(conns[rank])
        assert conns[rank][-1] == "Connected all trees"
        check_rank(r, rank, ring, lambda res: res.ring, ring_edges(r, rank))
        check_rank(r, rank, tree, lambda res: res.tree, tree_edges(r, rank, ring))
        pxn |= any("(" in v for *_, v in parse(ring) if v.startswith("NET"))
        # inside a node: P2P over NVLink, /read only on Ampere (sm 80)
        for *_, kind, via in parse(ring + tree):
            if kind == "p2p":
                assert via == ("P2P/CUMEM/read" if sm == 80 else "P2P/CUMEM")
    assert all(split(c)[2] == f"Connected all rings, use ring PXN {int(pxn)} GDR 1" for c in conns)


def test_cross_nic_1_rings_leave_by_the_other_nic(monkeypatch):
    """NCCL_CROSS_NIC=1: ring channels start at one NIC and end at another, so a node's first rank receives on
    the channel's first NIC and its last rank sends on the second (the rule above, now with two different ends)."""
    monkeypatch.setenv("NCCL_CROSS_NIC", "1")
    r = run_cluster(str(NDV5), 2, 2, StandIns(sm=90))
    ring = r.rings[0]
    assert any(ring.inter[c][0] != ring.inter[c][1] for c in range(ring.n_channels))
    conns = cluster_connections(r)
    for rank in range(r.nranks):
        check_rank(r, rank, split(conns[rank])[0], lambda res: res.ring, ring_edges(r, rank))
    ch0 = [x for x in parse(conns[0]) if x[0] == 0 and x[3] in ("send", "receive")]
    ch1 = [x for x in parse(conns[1]) if x[0] == 0 and x[3] in ("send", "receive")]
    assert {v for *_, v in ch0} != {v for *_, v in ch1}


def test_order_is_ncclTransportP2pSetup():
    """Within the ring (and the tree) phase: peers by distance i = 1 .. n-1, receives from rank - i before sends to
    rank + i, channels ascending."""
    r = cluster(NDV4, 80, 4)
    conns = cluster_connections(r)
    n = r.nranks
    for rank in range(n):
        for phase in split(conns[rank])[:2]:
            keys = []
            for c, src, dst, kind, _ in parse(phase):
                if kind == "receive":
                    keys.append(((rank - src) % n, 0, c))
                else:
                    keys.append(((dst - rank) % n, 1, c))
            assert keys == sorted(keys)


def test_pxn_disable_and_gdr_level(monkeypatch):
    """NCCL_PXN_DISABLE=1: no proxy on any line and ``use ring PXN 0``; NCCL_NET_GDR_LEVEL=LOC: no /GDRDMA and
    ``GDR 0``."""
    monkeypatch.setenv("NCCL_PXN_DISABLE", "1")
    r = run_cluster(str(NDV5), 2, 2, StandIns(sm=90))
    conns = cluster_connections(r)
    assert not any(re.search(r"NET/IB/\d+\(", x) for c in conns for x in c)
    assert all(split(c)[2].startswith("Connected all rings, use ring PXN 0") for c in conns)
    monkeypatch.delenv("NCCL_PXN_DISABLE")
    monkeypatch.setenv("NCCL_NET_GDR_LEVEL", "LOC")
    r = run_cluster(str(NDV5), 2, 2, StandIns(sm=90))
    conns = cluster_connections(r)
    assert not any("GDRDMA" in x for c in conns for x in c)
    assert all(split(c)[2].endswith("GDR 0") for c in conns)


def test_shm_inside_a_node_when_p2p_is_disabled(monkeypatch):
    """NCCL_P2P_DISABLE=1 with the NIC kept off intra-node traffic: local sends go over SHM, NCCL's SHM line."""
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    monkeypatch.setenv("NCCL_NET_DISABLE_INTRA", "1")
    r = run_cluster(str(NDV5), 2, 2, StandIns(sm=90))
    local = [x for c in cluster_connections(r) for x in c if "SHM" in x or "P2P" in x]
    assert local and all(re.fullmatch(r"Channel \d\d : \d+\[\d\] -> \d+\[\d\] via SHM/direct", x) for x in local)


def test_cli_prints_them_after_each_ranks_trees(capsys):
    assert main([str(NDV5), "--sm", "90", "--nodes", "2", "--nranks", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    i = next(k for k, x in enumerate(out) if x.startswith("node0 [1] NCCL INFO Trees"))
    assert re.match(r"node0 \[1\] NCCL INFO Channel 00/0 : 1\[1\] -> 2\[0\] \[send\] via NET/IB/0\(0\)/GDRDMA",
                    out[i + 1])
    assert "node1 [1] NCCL INFO Connected all trees" in out
