"""Feeding a topology into the lab: the runners' ``--topo`` (every rank then loads it as ``NCCL_TOPO_FILE`` and
searches itself, ``init_rank``), and the cost model's machine (what NCCL's ``initTransportsRank`` hands from
``ncclTopoCompute`` to ``ncclTopoTuneModel``).

``machine`` builds the cost model's ``Machine`` from one node's ring and tree graphs,
``cluster_machine`` from the multi-node search's (``init_cluster``), both through ``tuned_machine``.
"""
from __future__ import annotations

from .cost_model import GraphFigures
from .cost_model import Machine
from .init_cluster import ClusterResult
from .init_topo import TopoResult
from .search import PATTERN_NAMES, Graph
from .topo import ARCH_ARM, ARCH_POWER, ARCH_X86, CPU, PATH_TYPES, VENDOR_AMD, VENDOR_INTEL, GPU


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


def apply_topology(args, argv: list[str], log=None, job_size: int | None = None) -> None:
    """``--topo XML`` on the runners: every rank loads it as ``NCCL_TOPO_FILE`` and searches its own node
    (``init_rank``); ``--sm`` / ``--nvlinks`` travel as NCCLLAB_TOPO_SM / NCCLLAB_TOPO_NVLINKS.  ``-g N``
    (or mpirun's ``-n``) is N / --nodes GPUs per node, the first ones of the file; without it every GPU of the
    file is a rank on each node.  ``log``: the launching process also runs the search once to say what the
    ranks will find."""
    import os

    from .init_cluster import run_cluster
    from .init_topo import run_topology
    from .topo_xml import StandIns, TopoError, gpu_pcis, load_xml

    nodes = getattr(args, "nodes", 1)
    ngpus = len(gpu_pcis(load_xml(args.topo)))
    total = job_size or (args.nranks if _explicit_nranks(argv) else None)
    if total is not None and (total % nodes or not 1 <= total // nodes <= ngpus):
        raise TopoError(f"--topo {args.topo}: {total} ranks on {nodes} node(s) is not a whole number of the "
                        f"file's {ngpus} GPUs per node")
    local = total // nodes if total is not None else ngpus
    if job_size is None:
        args.nranks = local * nodes
    os.environ["NCCL_TOPO_FILE"] = os.path.abspath(args.topo)
    for var, value in (("NCCLLAB_TOPO_SM", args.sm), ("NCCLLAB_TOPO_NVLINKS", args.nvlinks)):
        if value is not None:
            os.environ[var] = str(value)
    if log is None:
        return
    stand = StandIns(sm=args.sm, nvlinks=args.nvlinks)
    if nodes > 1:
        c = run_cluster(args.topo, nodes, local, stand)
        notes, (ring, tree), comm_channels = c.nodes[0].stand_in_notes, c.aligned, c.channels[0].n
        pattern = max(t.pattern for t in c.trees)
    else:
        r = run_topology(args.topo, local, stand)
        notes, ring, tree, comm_channels, pattern = r.stand_in_notes, r.ring, r.tree, r.channels.n, r.tree.pattern
    for note in notes:
        log(f"# {note}")
    log(f"# --topo {args.topo}: {nodes} x {local} ranks; ring {ring.n_channels} x {ring.bw_intra:g} GB/s "
        f"{PATH_TYPES[ring.type_intra]}, tree {PATTERN_NAMES[pattern]} {tree.n_channels} x "
        f"{tree.bw_intra:g} GB/s; {comm_channels} channels after Postset")
