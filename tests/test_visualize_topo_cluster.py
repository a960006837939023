"""``python -m visualize topo XML --nodes K``: the picture is read back through ``dot -Tjson`` and checked against
the connection lines the ranks print (collectives.graph.init_cluster.cluster_connections): the NICs the ring
channel uses, each hop's edge and label, the PXN hop to the proxy, the crossNic legend; node clusters apart."""
import json
import re
import subprocess

import pytest

from collectives.graph.init_cluster import cluster_connections, run_cluster
from collectives.graph.topo_xml import StandIns
from conftest import ROOT
from visualize import machine

NDV5 = ROOT / "topologies" / "azure-ndv5-topo.xml"
SEND = re.compile(r"Channel (\d\d)/0 : (\d+)\[\d+\] -> (\d+)\[\d+\] (\[send\] )?via (\S+)$")
RECV = re.compile(r"Channel (\d\d)/0 : (\d+)\[\d+\] -> (\d+)\[\d+\] \[receive\] via (NET/IB/(\d+)\S*)$")


@pytest.fixture(scope="module")
def picture():
    r = run_cluster(str(NDV5), 2, 2, StandIns(sm=90))
    src = machine.cluster(r, 0)
    out = subprocess.run(["dot", "-Tjson"], input=src, capture_output=True, text=True, timeout=60, check=True)
    return r, json.loads(out.stdout)


def drawn(doc):
    """(nodes by name -> label, edges as (tail name, head name, label), clusters by name -> bounding box)."""
    objs = doc["objects"]
    names = {i: o["name"] for i, o in enumerate(objs)}
    nodes = {o["name"]: o.get("label", "") for o in objs if "nodes" not in o and "subgraphs" not in o}
    clusters = {o["name"]: [float(x) for x in o["bb"].split(",")] for o in objs if o["name"].startswith("cluster")}
    edges = {(names[e["tail"]], names[e["head"]], e.get("label") or e.get("xlabel", "")) for e in doc["edges"]
             if e.get("style") != "dotted"}
    return nodes, edges, clusters, {o["name"]: o.get("fillcolor") for o in objs}


def expected_edges(r, channel=0):
    """From the ranks' own lines: each hop of the channel's ring, through the proxy and the NICs when it crosses
    nodes (a send 'via NET/IB/d(p)' goes rank -> proxy p over NVLink, then to NIC d)."""
    conns = cluster_connections(r)
    out, nics = set(), set()
    for rank, lines in enumerate(conns):
        for line in lines:
            m = SEND.match(line)
            if not m or int(m.group(1)) != channel or int(m.group(2)) != rank:
                continue
            a, b, via = int(m.group(2)), int(m.group(3)), m.group(5)
            order = r.channels[0].rings[channel]
            if order[(order.index(a) + 1) % len(order)] != b:
                continue                      # a tree connection
            if not m.group(4):
                out.add((f"gpu{a}", f"gpu{b}", via))
                continue
            dev, proxy = re.match(r"NET/IB/(\d+)(?:\((\d+)\))?", via).groups()
            na, nb = r.node_of[a], r.node_of[b]
            start = f"gpu{a}"
            if proxy is not None:
                out.add((f"gpu{a}", f"gpu{proxy}", f"PXN: NVLink to rank {proxy}"))
                start = f"gpu{proxy}"
            out.add((start, f"node{na}_net{dev}", f"send {via}"))
            recv = next(RECV.match(x) for x in conns[b] if RECV.match(x) and int(RECV.match(x).group(1)) == channel
                        and int(RECV.match(x).group(2)) == a)
            out.add((f"node{na}_net{dev}", f"node{nb}_net{recv.group(5)}", f"network ch{channel}"))
            out.add((f"node{nb}_net{recv.group(5)}", f"gpu{b}", f"receive {recv.group(4)}"))
            nics |= {f"node{na}_net{dev}", f"node{nb}_net{recv.group(5)}"}
    return out, nics


def test_ring_edges_and_nics_are_the_connections(picture):
    r, doc = picture
    nodes, edges, _, fills = drawn(doc)
    want, nics = expected_edges(r)
    assert any("PXN" in label for *_, label in want)          # this machine's 2-GPU nodes send by PXN
    assert edges == want
    used = {name for name, fill in fills.items() if name.startswith("node") and "_net" in name
            and fill == "#fff3b0"}
    assert used == nics
    for name in nics:
        assert nodes[name] == f"NIC NET/IB/{name.rsplit('net', 1)[1]}"


def test_legend_says_what_cross_nic_means(picture):
    r, doc = picture
    nodes, *_ = drawn(doc)
    cross = r.aligned[0].cross_nic
    assert nodes["legend"].startswith(f"crossNic {cross}")
    assert "PXN" in nodes["legend"]


def test_node_clusters_do_not_overlap(picture):
    _, doc = picture
    _, _, clusters, _ = drawn(doc)
    (ax1, ay1, ax2, ay2), (bx1, by1, bx2, by2) = clusters["cluster_node0"], clusters["cluster_node1"]
    assert ax2 <= bx1 or bx2 <= ax1 or ay2 <= by1 or by2 <= ay1


def test_cli_draws_it(tmp_path):
    from visualize.__main__ import main
    assert main(["topo", str(NDV5), "--sm", "90", "--nodes", "2", "--nranks", "2", "-o", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 1000
    assert "NIC NET/IB/0" in (tmp_path / "c.svg").read_text()
