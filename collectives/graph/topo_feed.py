"""Feeding a topology search into the lab: the CPU ranks' rings, tree chains and tree pattern, and the cost model's
machine (what NCCL's ``initTransportsRank`` hands from ``ncclTopoCompute`` to ``setupChannel``, ``connectTrees``
and ``ncclTopoTuneModel``).

``lab_env`` gives the environment a communicator reads: ``NCCLLAB_RINGS`` (one ring per search channel, so the
communicator's search channel count is the graph's and Postset doubles it), ``NCCLLAB_TREE_CHAINS`` and
``NCCLLAB_TREE_PATTERN``.  ``machine`` builds the cost model's ``Machine`` from one node's ring and tree graphs,
``cluster_machine`` from the multi-node search's (``init_cluster``), both through ``tuned_machine``.
"""
from __future__ import annotations

from .connect import Channels
from .cost_model import GraphFigures
from .cost_model import Machine
from .init_cluster import ClusterResult
from .init_topo import TopoResult
from .search import PATTERN_NAMES, Graph
from .topo import ARCH_ARM, ARCH_POWER, ARCH_X86, CPU, PATH_TYPES, VENDOR_AMD, VENDOR_INTEL, GPU


def _join(orders: list[list[int]]) -> str:
    return "|".join(" ".join(str(r) for r in order) for order in orders)


def lab_env(ch: Channels) -> dict[str, str]:
    """The settings that make a communicator use these channels: rings and chains of the search channels."""
    n = ch.search_channels
    return {"NCCLLAB_RINGS": _join(ch.rings[:n]), "NCCLLAB_TREE_CHAINS": _join(ch.chains[:n]),
            "NCCLLAB_TREE_PATTERN": ch.tree_pattern}


def cost_graph(g: Graph, n_channels: int | None = None) -> GraphFigures:
    """The tuning figures of a searched graph; ``n_channels`` replaces its count (``comm->nChannels``' min)."""
    return GraphFigures(g.n_channels if n_channels is None else n_channels, g.bw_intra, g.bw_inter,
                        PATH_TYPES[g.type_intra], PATH_TYPES[g.type_inter], g.latency_inter, bool(g.same_channels))


def _cpu(system) -> tuple[str, str]:
    cpu = system.nodes[CPU][0]
    return ({ARCH_X86: "x86", ARCH_POWER: "power", ARCH_ARM: "arm"}.get(cpu.arch, "x86"),
            {VENDOR_INTEL: "intel", VENDOR_AMD: "amd"}.get(cpu.vendor, "other"))


def tuned_machine(name: str, systems: list, ring: Graph, tree: Graph, n_nodes: int, gpus_per_node: int,
                  tree_pattern: int, comm_channels: int, sources: dict | None = None) -> Machine:
    """``ncclTopoTuneModel``'s inputs as ``initTransportsRank`` leaves them: nNodes and nRanks, the CPU arch and
    vendor (``mixed`` where the nodes differ, as AllGather3 marks them), min/maxCompCap over every GPU, the ring and
    tree graphs with both channel counts set to their min, maxTreePattern and ``comm->nChannels`` after Postset."""
    archs, vendors = {_cpu(s)[0] for s in systems}, {_cpu(s)[1] for s in systems}
    arch = archs.pop() if len(archs) == 1 else "mixed"
    vendor = vendors.pop() if len(vendors) == 1 else "mixed"
    sms = [g.sm for s in systems for g in s.nodes[GPU]]
    n = min(ring.n_channels, tree.n_channels)
    pattern = tree_pattern if tree_pattern in PATTERN_NAMES else 1
    return Machine(name, n_nodes, gpus_per_node, min(sms), ring=cost_graph(ring, n), tree=cost_graph(tree, n),
                   max_comp_cap=max(sms), cpu_arch=arch, cpu_vendor=vendor, max_tree_pattern=pattern,
                   comm_channels=comm_channels, sources=sources or {})


def machine(r: TopoResult, name: str, sources: dict | None = None) -> Machine:
    """The cost model's machine for one node of this topology (``ncclTopoTuneModel``'s inputs)."""
    return tuned_machine(name, [r.system], r.ring, r.tree, 1, len(r.system.nodes[GPU]), r.tree.pattern,
                         r.channels.n, sources)


def cluster_machine(r: ClusterResult, name: str, sources: dict | None = None) -> Machine:
    """The cost model's machine for K nodes (``init_cluster.run_cluster``): the graphs after AllGather3's
    alignment, maxTreePattern the highest node's tree pattern, rank 0's channel count after its Postset."""
    ring, tree = r.aligned
    return tuned_machine(name, [node.system for node in r.nodes], ring, tree, len(r.nodes), r.local_ranks,
                         max(t.pattern for t in r.trees), r.channels[0].n, sources)


def _explicit_nranks(argv: list[str]) -> bool:
    flags = ("-g", "--ngpus", "--nranks", "-np")
    return any(a in flags or a.startswith(tuple(f + "=" for f in flags)) for a in argv)


def apply_topology(args, argv: list[str], log=None) -> None:
    """``--topo XML`` on the runners: search the topology (once per process tree: the parent exports the result
    to the ranks it spawns, each mpirun rank searches itself, as every NCCL rank does) and export ``lab_env``.
    ``-g N`` keeps the first N GPUs; without it every GPU of the file is a rank."""
    import os

    from .init_topo import run_topology
    from .topo_xml import StandIns, TopoError

    if getattr(args, "nodes", 1) > 1:
        raise TopoError("--topo describes one node; the multi-node search is not ported (drop --nodes)")
    nranks = args.nranks if _explicit_nranks(argv) else None
    key = f"{os.path.abspath(args.topo)}|{nranks}|{args.sm}|{args.nvlinks}"
    if os.environ.get("NCCLLAB_TOPO_KEY") == key:
        args.nranks = len(os.environ["NCCLLAB_RINGS"].split("|")[0].split())
        return
    r = run_topology(args.topo, nranks, StandIns(sm=args.sm, nvlinks=args.nvlinks))
    args.nranks = len(r.system.nodes[GPU])
    os.environ.update(lab_env(r.channels), NCCLLAB_TOPO_KEY=key)
    if log is not None:
        for note in r.stand_in_notes:
            log(f"# {note}")
        log(f"# --topo {args.topo}: {args.nranks} ranks; ring {r.ring.n_channels} x {r.ring.bw_intra:g} GB/s "
            f"{PATH_TYPES[r.ring.type_intra]}, tree {PATTERN_NAMES[r.tree.pattern]} {r.tree.n_channels} x "
            f"{r.tree.bw_intra:g} GB/s; {r.channels.n} channels after Postset")
