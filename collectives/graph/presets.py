"""Machines for the cost model: what NCCL's topology search finds on well-known systems, with sources.

``graph bandwidth x channels`` is what NCCL's search (``ncclTopoCompute``) prints as
``Pattern 4, crossNic 0, nChannels N, bw X/Y, type A/B``; ``comm_channels`` is the INIT log's ``Channel NN/MM``
count after ``ncclTopoPostset`` doubles it.  Values not printed by a cited log are marked as estimates.
The single-node DGX presets take their graphs from NCCL's search over a public topology file of the same GPU and
NVSwitch fabric (``topologies/``: Azure NDv4 for A100, NDv5 for H100); across nodes the published values stay (the
multi-node search is not ported).
"""
from __future__ import annotations

import functools
from pathlib import Path

from .cost_model import GraphFigures, Machine, TunerConstants
from .cpu_tuner import CpuTuner

TOPOLOGIES = Path(__file__).resolve().parent.parent.parent / "topologies"
# Single-node presets read from a public topology file, searched as NCCL would (collectives.graph.init_topo).
PRESET_TOPOLOGIES = {"dgx-a100": ("azure-ndv4-topo.xml", 80), "dgx-h100": ("azure-ndv5-topo.xml", 90)}


@functools.lru_cache(maxsize=None)
def searched(name: str) -> tuple[GraphFigures, GraphFigures, int] | None:
    """(ring, tree, Postset channels) NCCL's search finds on the preset's topology file, or None without it."""
    from .init_topo import run_topology
    from .topo_feed import cost_graph
    from .topo_xml import StandIns
    file, sm = PRESET_TOPOLOGIES[name]
    if not (TOPOLOGIES / file).exists():
        return None
    r = run_topology(str(TOPOLOGIES / file), stand=StandIns(sm=sm))
    return cost_graph(r.ring), cost_graph(r.tree), r.channels.n


def _from_topology(name: str, m: Machine) -> Machine:
    """A single-node preset takes its graphs from the search over its topology file."""
    found = searched(name)
    if m.n_nodes != 1 or found is None:
        return m
    ring, tree, comm_channels = found
    file = PRESET_TOPOLOGIES[name][0]
    return Machine(**{**m.__dict__, "ring": ring, "tree": tree, "comm_channels": comm_channels,
                      "sources": {**m.sources, "graph": f"NCCL's search (collectives.tools.topology) over topologies/{file}; "
                                                        f"published logs agree: " + m.sources.get("graph", "")}})

SOURCES = {
    "a100-graph": "GRAPH log quoted in public notes on NCCL's search: 'Pattern 4, crossNic 0, nChannels 12, bw "
                  "20.000000/20.000000, type NVL/PIX' for 8x A100 on NVSwitch (GPU->NVS 240 GB/s: 12 rings of "
                  "20 GB/s); the 24 ring channels it implies after Postset doubling are in the INIT log of "
                  "NVIDIA/nccl-tests#100 (HGX A100, 'Channel 23/24').",
    "h100-graph": "NVIDIA/nccl#1197 (NCCL 2.19.4, H100 nodes): 'Pattern 4, crossNic 0, nChannels 12, bw "
                  "30.000000/30.000000, type NVL/PIX, sameChannels 1' (ring) and 'Pattern 1 ... nChannels 12, bw "
                  "30/30' (tree).",
    "pcie-graph": "NVIDIA/nccl-tests#307 (8x RTX 4090 on PCIe): 'Pattern 4, crossNic 0, nChannels 1, bw "
                  "5.000000/5.000000, type SYS/PIX, sameChannels 1'.",
    "cpu-lab": "measured on this lab's 2-core machine with benchmarks/latency.py and allreduce_vs_mpi.py (n=2); "
               "the runs are in docs/measured.md.",
}


def dgx_a100(nodes: int = 1) -> Machine:
    g = GraphFigures(12, 20.0, 20.0 if nodes == 1 else 20.0, "NVL", "PIX")
    return _from_topology("dgx-a100", Machine(
        f"dgx-a100 x{nodes}", nodes, 8, 80, ring=g, tree=g, cpu_vendor="amd",
        sources={"graph": SOURCES["a100-graph"],
                 "inter": "estimate: 8x 200 Gb/s HDR IB (25 GB/s each) do not limit 12 x 20 GB/s rings"}))


def dgx_h100(nodes: int = 1) -> Machine:
    g = GraphFigures(12, 30.0, 30.0, "NVL", "PIX")
    return _from_topology("dgx-h100", Machine(f"dgx-h100 x{nodes}", nodes, 8, 90, ring=g, tree=g,
                                              cpu_vendor="intel", sources={"graph": SOURCES["h100-graph"]}))


def pcie_box(gpus: int = 8, comp_cap: int = 89) -> Machine:
    g = GraphFigures(1, 5.0, 5.0, "SYS", "PIX")
    return Machine(f"pcie-{gpus}x-cc{comp_cap}", 1, gpus, comp_cap, ring=g, tree=g, cpu_vendor="intel",
                   sources={"graph": SOURCES["pcie-graph"]})


# This lab's transports: SHM through host memory (path PHB, so NCCL's PCI latency row), no GPU (compute
# capability 0, so LL128 is off unless NCCL_PROTO names it).  The tuner constants are replaced by values measured
# here, as a tuner plugin would: base latency + 3 us per ring or tree step inside a node, except Ring/LL and
# Ring/Simple, which run compiled (``device/compiled``): 2.5 us (LL) and 3.0 us (Simple) + 1 us per step, so that
# LL keeps the smallest sizes and Simple's bandwidth takes over from a few KiB (measured at n = 2: both 8 us at
# 8-512 B, Simple 11 against LL 12 us at 4 KiB, 18 against 37 at 32 KiB: benchmarks/tuning_check.py).  A step
# across emulated nodes goes through the Python proxy thread on both sides, hundreds of microseconds (the runs
# behind both rows: docs/measured.md).  Rows: Tree, Ring; columns: LL, LL128, Simple.
_INTRA = ((3.0, 3.0, 3.0), (1.0, 3.0, 1.0), *((0, 0, 0),) * 5)
_NET = ((600.0, 600.0, 360.0), (1155.0, 1155.0, 860.0), *((0, 0, 0),) * 5)
CPU_CONSTANTS = TunerConstants(
    base_latencies=((25.9, 30.3, 23.3), (2.5, 30.3, 3.0), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0)),
    hw_latencies=(_INTRA, _INTRA, _NET),
)


def cpu_lab(nranks: int, nodes: int = 1, nchannels: int = 1, comm_channels: int | None = None,
            bw_per_channel: float = 6.0, ranks_per_core: float = 1.0, tuner: bool = True) -> Machine:
    """``nchannels``: the channels the search would find (one ring per channel); ``comm_channels``: after
    ``ncclTopoPostset`` doubles them (default 2x); ``ranks_per_core``: the ranks on this machine over its cores
    (above 1, oversubscribed: the lab's tuner plugin then prefers Tree/Simple for small AllReduces on one node, up
    to a size that depends on it: ``cpu_tuner``); ``tuner``: False without that plugin (``NCCL_TUNER_PLUGIN=none``)."""
    g = GraphFigures(nchannels, bw_per_channel, bw_per_channel, "PHB", "PHB")
    return Machine(f"cpu-lab n={nranks}", nodes, max(1, nranks // max(1, nodes)), 0, ring=g, tree=g,
                   cpu_vendor="amd", comm_channels=comm_channels or min(64, 2 * nchannels),
                   algorithms=("Tree", "Ring"), constants=CPU_CONSTANTS, sources={"constants": SOURCES["cpu-lab"]},
                   tuner=CpuTuner(nodes, nranks / max(1, nodes), ranks_per_core) if tuner else None)


PRESETS = {"dgx-a100": dgx_a100, "dgx-h100": dgx_h100, "pcie": pcie_box, "cpu": cpu_lab}


def preset(name: str, nodes: int = 1, nranks: int = 8) -> Machine:
    key = name.lower()
    if key not in PRESETS:
        raise ValueError(f"unknown preset {name!r} (choose from {', '.join(PRESETS)})")
    if key == "cpu":
        return cpu_lab(nranks, nodes)
    if key == "pcie":
        return pcie_box()
    return PRESETS[key](nodes)
