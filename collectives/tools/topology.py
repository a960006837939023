"""``python -m collectives.tools.topology TOPO.xml``: NCCL's topology search, printed as NCCL prints it.

    python -m collectives.tools.topology topologies/ndv5-topo.xml --sm 90
    python -m collectives.tools.topology my-dump.xml --nranks 4            # an NCCL_TOPO_DUMP_FILE output
    python -m collectives.tools.topology my-dump.xml --brief               # only the graphs and channels
    python -m collectives.tools.topology topologies/azure-ndv4-topo.xml --sm 80 --nodes 2   # 2 nodes x 8 GPUs

Runs the steps of ``initTransportsRank`` (``collectives.graph.init_topo``) with the XML's GPUs as ranks 0..N-1 in
PCI order, and prints NCCL's INFO lines: ``=== System ...`` with the node tree and paths (``ncclTopoPrint``),
``Pattern ...`` and the channel GPU lines per graph (``ncclTopoPrintGraph``), each rank's ``Tree`` lines, rank 0's
``Channel NN/MM :`` rings and every rank's ``Ring NN`` and ``Trees`` lines.  Lines are ``[rank] NCCL INFO ...``
(NCCL's ``host:pid:tid`` prefix dropped); lines starting with ``#`` are ours.  With ``--nodes K``
(``collectives.graph.init_cluster``): K identical nodes, ranks node-major, NETs at both ends of every channel, and
every rank's lines as ``node<n> [<local rank>] NCCL INFO ...``, each rank's ring and tree connections (transport,
NIC, PXN proxy, GDR: ``collectives.graph.transport_select``) after its ``Trees`` line; ``--explain`` adds node 0's
search steps (``# search:``) and its PXN routes (``# pxn:``).

Bare files (GPUs and NICs as plain PCI nodes, like the Azure files published for NCCL_TOPO_FILE) need stand-ins
for what NCCL asks NVML and the net plugin: ``--sm``, ``--nvlinks`` (default: NCCL's per-SM maximum, all to one
NVSwitch), and every PCI node of class 0x02xxxx counts as an IB NIC unless ``--no-nics``.
"""
from __future__ import annotations

import argparse
import re
import sys

from collectives.graph.connect import channel_lines, rank_lines, tree_lines
from collectives.graph.init_cluster import ClusterResult, cluster_connections, cluster_log, run_cluster
from collectives.graph.init_topo import TopoResult, run_topology
from collectives.graph.search import PATTERN_NAMES
from collectives.graph.topo_xml import StandIns, TopoError, dump_xml


def summary(r: TopoResult) -> list[str]:
    """Our one-paragraph reading of the result (``#`` lines)."""
    out = []
    for name, g in (("ring", r.ring), ("tree", r.tree), ("nvls", r.nvls)):
        if g is None:
            continue
        out.append(f"# {name} graph: {PATTERN_NAMES.get(g.pattern, g.pattern)}, {g.n_channels} channels x "
                   f"{g.bw_intra:g} GB/s")
    out.append(f"# communicator: {r.channels.n} channels (Postset doubles {r.channels.search_channels}); "
               f"tree pattern {r.channels.tree_pattern}")
    return out


def render(r: TopoResult, brief: bool = False, ranks: list[int] | None = None) -> list[str]:
    """Every line ``main`` prints, in NCCL's order (rank 0's search, then per rank connectTrees/Postset lines)."""
    out = [f"# {note}" for note in r.stand_in_notes]
    nranks = len(r.system.nodes[0])
    lines = r.system_lines[:1] + r.graph_lines if brief else r.log
    out += [f"[0] NCCL INFO {line}" for line in lines]
    for rank in (range(nranks) if ranks is None else ranks):
        if not brief:
            out += [f"[{rank}] NCCL INFO {line}" for line in tree_lines(r.channels, rank)]
        if rank == 0:
            out += [f"[0] NCCL INFO {line}" for line in channel_lines(r.channels)]
        lines = rank_lines(r.channels, rank)
        out += [f"[{rank}] NCCL INFO {line}" for line in (lines[-1:] if brief else lines)]
    return out + summary(r)


CONNECT_NOTE = ("# the Channel NN/0 connection lines: NCCL prints them at init with NCCL_RUNTIME_CONNECT=0, else "
                "when the first collective needs the ring (or the tree)")


def render_cluster(r: ClusterResult) -> list[str]:
    """Every line ``main`` prints for ``--nodes K``: the stand-in notes, then every rank's INFO lines as
    ``node<n> [<local rank>] NCCL INFO ...``, each rank's ring and tree connection lines after its Trees line."""
    return ([f"# {note}" for note in r.nodes[0].stand_in_notes] + cluster_log(r, cluster_connections(r))
            + [CONNECT_NOTE])


def explain_cluster(r: ClusterResult) -> list[str]:
    """``--explain`` with ``--nodes``: node 0's search as it ran (``# search:`` lines, each attempt and the step
    that followed it; every node searches the same XML the same way), the PXN routes ``ncclTopoComputePaths``
    made and why (``# pxn:``), and which connections use them (``# pxn: ... used by``)."""
    res = r.nodes[0]
    out = [f"# search: node 0 ({len(r.nodes)} identical nodes search the same system; graphs aligned over all "
           f"ranks: ring crossNic {r.aligned[0].cross_nic}, tree pattern {r.channels[0].tree_pattern})"]
    out += [f"# search: {line}" for line in res.search_trace]
    routes = res.system.pxn_routes
    out += [f"# pxn: {line}" for line in routes] or ["# pxn: no PXN path on this node (NCCL_PXN_DISABLE=1, or "
                                                     "every GPU reaches each NIC as well by itself)"]
    used = [line for lines in cluster_connections(r)[:r.local_ranks] for line in lines
            if re.search(r"\[send\] via NET/\w+/\d+\(\d+\)", line)]
    if used:
        out.append(f"# pxn: used by {len(used)} of node 0's sends (the channel's graph end is a NIC whose own GPU "
                   f"is another rank, whose proxy then drives it), e.g. {used[0]}")
    elif routes:
        out.append("# pxn: no ring or tree send of node 0 uses them: every channel's graph ends at a NIC of "
                   "the GPU that sends")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m collectives.tools.topology", description=__doc__.split("\n")[0])
    p.add_argument("xml", help="topology XML (NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE format)")
    p.add_argument("--nranks", type=int, help="ranks = the first N GPUs in PCI order (default: all); per node")
    p.add_argument("--nodes", type=int, default=1, help="K identical nodes in one communicator, ranks node-major "
                   "(rank = node * N + local rank); NETs at both ends of each channel")
    p.add_argument("--sm", type=int, help="compute capability of GPUs the file does not describe, e.g. 90")
    p.add_argument("--nvlinks", type=int, help="NVLinks per GPU (to an NVSwitch) when the file has none")
    p.add_argument("--nic-speed", type=int, default=400000, metavar="MBPS",
                   help="speed the stand-in net plugin reports per NIC (default 400000; 200000 for HDR)")
    p.add_argument("--no-nics", action="store_true", help="no net plugin devices (NICs are trimmed)")
    p.add_argument("--nvls", action="store_true", help="also search the NVLS graph")
    p.add_argument("--brief", action="store_true", help="only System, Pattern, channel, Channel and Trees lines")
    p.add_argument("--explain", action="store_true", help="also print every search attempt and the step after it "
                   "(# search: lines); with --nodes also why PXN paths exist and which sends use them (# pxn:)")
    p.add_argument("--dump-xml", metavar="FILE", help="write the fused XML NCCL would dump (NCCL_TOPO_DUMP_FILE)")
    a = p.parse_args(argv)
    stand = StandIns(sm=a.sm, nvlinks=a.nvlinks, nics=not a.no_nics, nic_speed=a.nic_speed)
    if a.nodes != 1:
        if a.brief or a.nvls or a.dump_xml:
            print("python -m collectives.tools.topology: --brief, --nvls and --dump-xml are one-node "
                  "options (not with --nodes)", file=sys.stderr)
            return 2
        try:
            c = run_cluster(a.xml, a.nodes, a.nranks, stand)
            lines = render_cluster(c) + (explain_cluster(c) if a.explain else [])
        except (TopoError, NotImplementedError, ValueError) as e:
            print(f"python -m collectives.tools.topology: {e}", file=sys.stderr)
            return 2
        try:
            print("\n".join(lines))
        except BrokenPipeError:
            sys.stderr.close()
        return 0
    try:
        r = run_topology(a.xml, a.nranks, stand, nvls=a.nvls)
        if a.dump_xml:
            from collectives.graph.topo_xml import fused_xml, load_xml
            text = dump_xml(fused_xml(load_xml(a.xml), len(r.system.nodes[0]), stand))
            with open(a.dump_xml, "w") as f:
                f.write(text)
    except (TopoError, NotImplementedError, ValueError) as e:
        print(f"python -m collectives.tools.topology: {e}", file=sys.stderr)
        return 2
    try:
        for line in render(r, a.brief):
            print(line)
        if a.explain:
            for line in r.search_trace:
                print(f"# search: {line}")
    except BrokenPipeError:          # e.g. piped into head
        sys.stderr.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
