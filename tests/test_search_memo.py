"""The graph search works out what depends on paths alone once per search (``search.Search``: the NIC lists of
``ncclTopoSelectNets``, ``ncclTopoGetLocal``, the static part of ``ncclTopoSearchNextGpuSort``'s scores,
``followPath``'s per-link plan) and reads what the search changes, the bandwidth left on links, each time."""
from __future__ import annotations

from pathlib import Path

import collectives.graph.search as search
from collectives.graph.init_topo import search_node
from collectives.graph.nets import gpu_pci_links
from collectives.graph.search import RING, Graph, Search, topo_compute
from collectives.graph.topo import GPU, NET
from collectives.graph.topo_xml import StandIns

DGX1 = str(Path(__file__).resolve().parent.parent / "topologies" / "dgx1-like.xml")


class _Stop(Exception):
    pass


def _dgx1_system():
    """A DGX-1-like node (V100s in an NVLink cube mesh, no NVSwitch, 4 NICs) as node 0 of 2, so its channels start
    and end at NICs: its paths computed, before any search."""
    got = {}

    def keep(system, graph, trace=None):
        got["system"] = system
        raise _Stop

    try:
        search_node(DGX1, 8, StandIns(), first_rank=0, comm_nranks=16, compute=keep)
    except _Stop:
        pass
    return got["system"]


def test_a_search_lists_each_nic_choice_once(monkeypatch):
    system = _dgx1_system()
    calls = []
    real = search.select_nets
    monkeypatch.setattr(search, "select_nets", lambda s, t, g: calls.append((t, g)) or real(s, t, g))
    graph = topo_compute(system, Graph(id=0, pattern=RING, min_channels=1, max_channels=32))
    assert not graph.fallback
    # one call per (typeInter, GPU or -1) asked, not one per step of the walk (hundreds of thousands before)
    assert len(calls) == len(set(calls)) and len(calls) <= 16 * (len(system.nodes[GPU]) + 1), len(calls)


def test_next_gpu_order_reads_the_pci_bandwidth_left_on_each_call():
    system = _dgx1_system()
    s = Search(system)
    graph = Graph(id=0, pattern=RING, min_channels=1, max_channels=32)
    graph.inter[0][0] = system.nodes[NET][0].id
    gpu = system.nodes[GPU][0]
    first = s.next_gpu_sort(graph, gpu, 1)
    assert len(first) > 2
    # the search takes the bandwidth of the first candidate's PCI link: it falls behind the GPUs as close to the
    # NIC, in this Search (its memo filled) as in a new one (nothing memoised)
    link, back = gpu_pci_links(system.nodes[GPU][first[0]])
    saved = link.bw, back.bw
    link.bw = back.bw = 0.0
    try:
        again, fresh = s.next_gpu_sort(graph, gpu, 1), Search(system).next_gpu_sort(graph, gpu, 1)
    finally:
        link.bw, back.bw = saved
    restored = s.next_gpu_sort(graph, gpu, 1)
    # (lists only in the asserts: pytest's report of a failed one would print a node, its links and paths: long)
    assert again == fresh, (again, fresh)
    assert again[0] != first[0] and sorted(again) == sorted(first), (first, again)
    assert restored == first, (restored, first)
