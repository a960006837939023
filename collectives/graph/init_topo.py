"""The topology steps of ``initTransportsRank`` (NCCL ``src/init.cc``) for one node whose ranks are the XML's GPUs.

    ncclTopoGetSystem (load, fill, trim, fuse)   -> topo_xml.fused_xml, topo.system_from_xml
    ncclTopoComputePaths; ncclTopoTrimSystem; ncclTopoComputePaths again
    ncclTopoSearchInit; ncclTopoPrint
    ncclTopoCompute + ncclTopoPrintGraph: RING (min 1, max 32 channels), then BALANCED_TREE (exactly the ring's
    count), then NVLS when asked
    ncclTopoPreset / ncclTopoPostset -> connect.postset

Every rank runs the same search on the same fused system, so one search stands for all ranks (NCCL checks
this across ranks with its AllGather3 min/max; so does the fixture harness).  ``search_node`` is the part up to
the searches, for one node of a larger communicator too (``init_cluster``: NETs at the channels' ends).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .connect import Channels, postset
from .paths import compute_paths, print_paths, search_init, trim_system
from .search import BALANCED_TREE, NVLS, RING, Graph, topo_compute
from .search import print_graph as _print_graph


def print_graph(system: System, graph: Graph) -> list[str]:
    """``ncclTopoPrintGraph``, preceded by ``ncclTopoCompute``'s fallback line when the search found nothing."""
    head = [f"Could not find a path for pattern {graph.pattern}, falling back to simple order"] if graph.fallback \
        else []
    return head + _print_graph(system, graph)
from .topo import GPU, System, print_system, system_from_xml
from .topo_xml import StandIns, TopoError, fused_xml, gpu_pcis, load_xml


@dataclass
class TopoResult:
    system: System
    ring: Graph
    tree: Graph
    nvls: Graph | None
    channels: Channels | None
    load_lines: list = field(default_factory=list)     # loading and stand-in lines
    system_lines: list = field(default_factory=list)   # ncclTopoPrint's tree (=== System ... ===)
    path_lines: list = field(default_factory=list)     # ncclTopoPrintPaths
    graph_lines: list = field(default_factory=list)    # ncclTopoPrintGraph per graph searched
    stand_in_notes: list = field(default_factory=list)
    search_trace: list = field(default_factory=list)   # every search attempt (ours, see search.topo_compute)

    @property
    def log(self) -> list[str]:
        """Rank 0's INFO lines of the search, in NCCL's order."""
        return self.load_lines + self.system_lines + self.path_lines + self.graph_lines


def search_node(path: str, nranks: int | None = None, stand: StandIns = StandIns(), nvls: bool = False,
                first_rank: int = 0, comm_nranks: int | None = None, compute=topo_compute) -> TopoResult:
    """The steps of ``initTransportsRank`` up to the searches, for the node whose ranks are ``first_rank`` ...
    ``first_rank + nranks - 1`` of a communicator of ``comm_nranks`` (default: this node alone, so no NETs in the
    channels); ``channels`` is left None (Postset needs every node).  ``compute``: ``ncclTopoCompute``
    (``graph_xml.compute`` adds its NCCL_GRAPH_FILE branch)."""
    xml = load_xml(path)
    nranks = nranks or len(gpu_pcis(xml))
    notes: list[str] = []
    load = [f"Loading topology file {path}", "Loading " + (f"topology {xml.attrs['name']}" if "name" in xml.attrs
                                                          else "unnamed topology")]
    fill_log: list[str] = []
    fused = fused_xml(xml, nranks, stand, fill_log, first_rank)
    load += fill_log
    system = system_from_xml(fused)
    compute_paths(system)
    trim_system(system, first_rank, comm_nranks or nranks)
    compute_paths(system)
    search_init(system)
    graph_lines: list[str] = []
    trace: list[str] = []
    ring = compute(system, Graph(id=0, pattern=RING, min_channels=1, max_channels=32), trace)
    graph_lines += print_graph(system, ring)
    tree = compute(system, Graph(id=1, pattern=BALANCED_TREE, min_channels=ring.n_channels,
                                      max_channels=ring.n_channels), trace)
    graph_lines += print_graph(system, tree)
    nv = None
    if nvls:
        nv = compute(system, Graph(id=3, pattern=NVLS, min_channels=1, max_channels=64), trace)
        graph_lines += print_graph(system, nv)
    if any("assuming NVSwitch" in line for line in fill_log):
        notes.append("stand-in: GPUs without <nvlink> got NVLinks to a hidden NVSwitch (NCCL asks NVML)")
    if any("Filled" in line for line in fill_log):
        notes.append("stand-in: every PCI node of class 0x02xxxx is one IB NIC with GPUDirect RDMA "
                     "(NCCL asks the net plugin)")
    if len(system.nodes[GPU]) != nranks:
        raise TopoError(f"{len(system.nodes[GPU])} GPUs in the system for {nranks} ranks (GPUs sharing a bus id, "
                        f"or a <gpu> without a rank?)")
    return TopoResult(system, ring, tree, nv, None, load, print_system(system), print_paths(system),
                      graph_lines, notes, trace)


def run_topology(path: str, nranks: int | None = None, stand: StandIns = StandIns(), nvls: bool = False
                 ) -> TopoResult:
    """Run NCCL's topology steps on ``path``; ``nranks`` defaults to every GPU of the file."""
    r = search_node(path, nranks, stand, nvls)
    r.channels = postset(r.ring, r.tree)
    return r
