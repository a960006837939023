"""Feeding a topology search into the lab: the CPU ranks' rings, tree chains and tree pattern, and the cost model's
machine (what NCCL's ``initTransportsRank`` hands from ``ncclTopoCompute`` to ``setupChannel``, ``connectTrees``
and ``ncclTopoTuneModel``).

``lab_env`` gives the environment a communicator reads: ``NCCLLAB_RINGS`` (one ring per search channel, so the
communicator's search channel count is the graph's and Postset doubles it), ``NCCLLAB_TREE_CHAINS`` and
``NCCLLAB_TREE_PATTERN``.  ``machine`` builds the cost model's ``Machine`` from the ring and tree graphs.
"""
from __future__ import annotations

from .connect import Channels
from .cost_model import GraphFigures
from .cost_model import Machine
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


def cost_graph(g: Graph) -> GraphFigures:
    return GraphFigures(g.n_channels, g.bw_intra, g.bw_inter, PATH_TYPES[g.type_intra], PATH_TYPES[g.type_inter],
                     g.latency_inter, bool(g.same_channels))


def machine(r: TopoResult, name: str, sources: dict | None = None) -> Machine:
    """The cost model's machine for one node of this topology (``ncclTopoTuneModel``'s inputs)."""
    gpus = r.system.nodes[GPU]
    cpu = r.system.nodes[CPU][0]
    arch = {ARCH_X86: "x86", ARCH_POWER: "power", ARCH_ARM: "arm"}.get(cpu.arch, "x86")
    vendor = {VENDOR_INTEL: "intel", VENDOR_AMD: "amd"}.get(cpu.vendor, "other")
    tree_pattern = r.tree.pattern if r.tree.pattern in PATTERN_NAMES else 1
    return Machine(name, 1, len(gpus), min(g.sm for g in gpus), ring=cost_graph(r.ring), tree=cost_graph(r.tree),
                   max_comp_cap=max(g.sm for g in gpus), cpu_arch=arch, cpu_vendor=vendor,
                   max_tree_pattern=tree_pattern, comm_channels=r.channels.n, sources=sources or {})


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
