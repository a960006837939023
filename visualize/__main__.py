"""``python -m visualize KIND ...``: diagrams of a traced run or of a real NCCL log, bandwidth curves.

Diagrams are written with the real Graphviz ``dot`` as OUT.dot, OUT.png and OUT.svg.  Bad input is one line on
stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

KINDS = {
    "topology": "(a) ranks grouped by node, each channel's ring, every edge labelled with the transport that "
                "really connected it (SHM, NET/Socket/0), from a trace directory",
    "trees": "(b) both trees of each ring side by side: channel c (tree 0) and its Postset copy (tree 1), "
             "ranks filled by node, from a trace directory",
    "flow": "(c) one collective on one channel, from a trace: every primitive call a box, every chunk sent an "
            "arrow to the call that received it (ring: rank x step grid; tree: up to the root, then down)",
    "log": "(d) rings and trees of a real NCCL INFO log: PREFIX-rings and PREFIX-trees",
    "explain": "a short text report of a real NCCL INFO log plus its diagrams, in one folder (same as "
               "python -m tracing explain)",
    "curves": "algbw and busbw against size: runner --json rows, nccl-tests output, MPI and cost-model series",
    "ibseq": "the message sequence of one NET/IB transfer (receiver posts CTS, sender writes, WRITE_WITH_IMM, "
             "completion), from the trace of an NCCL_NET=IB run",
    "topo": "the machine as NCCL's topology sees it (with --nodes K: every node's GPUs and NICs and one channel's ring across them by the NICs and PXN hops the search chose; else CPUs, PCIe switches, GPUs, NICs, NVSwitches, link types and "
            "bandwidths) with the searched rings over it, from a topology XML (NCCL_TOPO_DUMP_FILE)",
    "p2p": "one point-to-point plan (an all-to-all) as a rounds x ranks grid: whom each rank sends to and "
           "receives from in each round of NCCL's p2p schedule, on which channels, from a trace directory",
    "sweep": "runs our AllReduce and MPI's side by side under mpirun, then plots them",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m visualize", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="kinds:\n" + "\n".join(f"  {k:9} {v}" for k, v in KINDS.items())
                                + "\n\n'python -m visualize KIND --help' lists the flags of each kind.")
    sub = p.add_subparsers(dest="kind", required=True, metavar="KIND")

    def kind(name: str, inputs: str, out: str):
        q = sub.add_parser(name, help=KINDS[name], description=KINDS[name])
        q.add_argument("inputs", nargs="+" if name == "curves" else None, metavar=inputs[0], help=inputs[1])
        q.add_argument("-o", "--out", required=True, help=out)
        q.add_argument("--title", default="", help="title of the picture (default: one made from the input)")
        return q

    trace = ("TRACE_DIR", "a NCCLLAB_TRACE directory (trace-rank*.jsonl)")
    q = kind("topology", trace, "output path without extension: OUT.dot, OUT.png, OUT.svg")
    q.add_argument("--max-channels", type=int, default=8, help="draw the rings of at most this many channels "
                   "(default 8)")
    q = kind("trees", trace, "output path without extension: OUT.dot, OUT.png, OUT.svg")
    q.add_argument("--max-rings", type=int, default=4, help="draw the two trees of at most this many rings "
                   "(default 4, i.e. 8 channels)")
    q = kind("flow", trace, "output path without extension: OUT.dot, OUT.png, OUT.svg")
    q.add_argument("--seq", type=int, default=0, help="which collective of the trace, from 0 (default 0)")
    q.add_argument("--channel", type=int, default=0, help="which channel, 0..nchannels-1 (default 0)")
    q = kind("p2p", trace, "output path without extension: OUT.dot, OUT.png, OUT.svg")
    q.add_argument("--plan", type=int, default=-1, help="which of each rank's p2p plans, from 0 (default -1: the "
                   "last)")
    q = kind("ibseq", trace, "output path without extension: OUT.dot, OUT.png, OUT.svg")
    q.add_argument("--slot", type=int, default=0, help="which FIFO slot's transfer, 0..7 (default 0)")
    q = kind("topo", ("TOPO_XML", "a topology XML as NCCL_TOPO_DUMP_FILE writes it, or a bare one with --sm"),
             "output path without extension: OUT.dot, OUT.png, OUT.svg")
    q.add_argument("--channel", type=int, default=0, help="the searched channel to highlight (default 0)")
    q.add_argument("--sm", type=int, help="compute capability of GPUs the file leaves bare (default: none)")
    q.add_argument("--nvlinks", type=int, help="NVLinks per GPU when the file has none (default: NCCL's maximum)")
    q.add_argument("--no-nics", action="store_true", help="no net plugin devices (default: PCI class 0x02 = IB NIC)")
    q.add_argument("--nodes", type=int, default=1, help="K identical nodes in one communicator: each node's GPUs and "
                   "NICs, and the channel's ring across them by the NICs the search chose (default 1)")
    q.add_argument("--nranks", type=int, help="GPUs per node (default: all of the file's), with --nodes")
    q.add_argument("--nic-speed", type=int, default=400000, metavar="MBPS",
                   help="speed the stand-in net plugin reports per NIC (default 400000)")
    q = kind("log", ("NCCL_LOG", "a real NCCL_DEBUG=INFO log (ranks interleaved, any prefixes)"),
             "output prefix: PREFIX-rings.* and PREFIX-trees.*")
    q.add_argument("--max-channels", type=int, default=8, help="rings of at most this many channels (default 8)")
    q.add_argument("--max-rings", type=int, default=4, help="trees of at most this many rings (default 4)")
    kind("explain", ("NCCL_LOG", "a real NCCL_DEBUG=INFO log"), "output folder: report.txt and the diagrams")
    q = kind("curves", ("INPUT", "runner --json files, nccl-tests text output, series JSON (MPI, collectives.tools.tune "
                        "--series); any mix"), "the PNG to write")
    q.add_argument("--skip", action="append", default=[], metavar="TEXT", help="leave out series whose label "
                   "contains TEXT (repeatable; default: none), e.g. a measurement given twice")
    q = sub.add_parser("sweep", help=KINDS["sweep"], description=KINDS["sweep"])
    q.add_argument("-o", "--out", required=True, help="output folder: bench.json and curve.png")
    q.add_argument("--title", default="", help="title of the plot (default: a generic one)")
    q.add_argument("-g", "--nranks", type=int, default=2, help="ranks under mpirun, >= 1 (default 2)")
    q.add_argument("-b", default="8", help="smallest size, nccl-tests syntax (default 8)")
    q.add_argument("-e", default="64M", help="largest size (default 64M)")
    return p


def main(argv=None) -> int:
    a = _parser().parse_args(argv)
    try:
        print("\n".join(_run(a)))
    except (OSError, ValueError, RuntimeError, subprocess.CalledProcessError) as exc:
        msg = f"{exc.filename}: {exc.strerror}" if isinstance(exc, OSError) and exc.filename else str(exc)
        print(f"python -m visualize {a.kind}: {msg}", file=sys.stderr)
        return 2
    return 0


def _run(a) -> list[str]:
    from . import curves, diagrams
    for flag in ("max_channels", "max_rings"):
        if getattr(a, flag, 1) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} {getattr(a, flag)}: must be at least 1")
    if a.kind == "curves":
        return [curves.plot(a.inputs, a.out, a.title, tuple(a.skip))]
    if a.kind in ("topology", "trees", "flow"):
        from tracing import export
        metas, events = export.load_all(a.inputs)
        meta = metas[min(metas)]
        if a.kind == "topology":
            hosts = meta["hosts"] if len(set(meta["hosts"])) == meta["nnodes"] > 1 else None  # not NCCL_HOSTID
            src = diagrams.topology(meta["nranks"], meta["node_of_rank"], meta["rings"],
                                    export.edge_transports(metas), hosts, a.title, a.max_channels)
        elif a.kind == "trees":
            src = diagrams.trees(_trees_from_meta(meta), meta["nranks"], a.title, meta["node_of_rank"],
                                 _roles_from_meta(meta), export.edge_transports(metas), a.max_rings)
        else:
            from . import flow
            meta = {**meta, "trees": _trees_from_meta(meta)}
            src = flow.chunk_flow(events, meta, a.seq, a.channel, a.title)
        return diagrams.render(src, a.out)
    if a.kind == "p2p":
        from tracing import export

        from . import p2p
        meta, events = export.load(a.inputs)
        return diagrams.render(p2p.grid(events, meta, a.plan, a.title), a.out)
    if a.kind == "ibseq":
        from tracing import export

        from . import ib_sequence
        _, events = export.load_all(a.inputs)
        recv, send = ib_sequence.pick(events, None, a.slot)
        return diagrams.render(ib_sequence.ib_sequence(recv, send, a.title), a.out)
    if a.kind == "topo":
        from collectives.graph.init_topo import run_topology
        from collectives.graph.topo_xml import StandIns

        from . import machine
        stand = StandIns(sm=a.sm, nvlinks=a.nvlinks, nics=not a.no_nics, nic_speed=a.nic_speed)
        if a.nodes != 1:
            from collectives.graph.init_cluster import run_cluster
            c = run_cluster(a.inputs, a.nodes, a.nranks, stand)
            return diagrams.render(machine.cluster(c, a.channel, a.title), a.out)
        r = run_topology(a.inputs, a.nranks, stand=stand)
        return diagrams.render(machine.machine(r, a.channel, a.title), a.out)
    if a.kind == "log":
        from . import explain
        facts = explain.read_log(a.inputs)
        files = explain.draw(facts, a.out + "-rings", a.out + "-trees", os.path.basename(a.inputs), a.title,
                             a.max_channels, a.max_rings)
        if not files:
            n = explain.facts_of.nranks(facts)
            raise ValueError(f"{a.inputs}: nothing to draw: " + (
                f"{n} ranks, more than {explain.MAX_DRAWN_RANKS}" if n > explain.MAX_DRAWN_RANKS else
                "no 'Channel NN/MM :' ring or 'Trees' line"))
        return files
    if a.kind == "explain":
        from . import explain
        return explain.explain(a.inputs, a.out)
    return _sweep(a)


def _trees_from_meta(meta: dict) -> list[dict]:
    """Every channel's tree as the communicator built it."""
    if "trees" in meta:
        return [{int(r): (up, list(down)) for r, (up, down) in t.items()} for t in meta["trees"]]
    from collectives.graph.trees import channel_trees  # traces written before the trees were recorded
    tl = channel_trees(meta["rings"], meta["node_of_rank"])
    return [{r: (node.up, list(node.down)) for r, node in t.items()} for t in tl]


def _roles_from_meta(meta: dict) -> list:
    from .diagrams import channel_roles
    if "channel_origin" in meta:  # (search ring, tree) per channel as the communicator's Postset made them
        first = {tuple(o): c for c, o in reversed(list(enumerate(meta["channel_origin"])))}
        return [(r, t, first[(r, t)] if first[(r, t)] != c else None)
                for c, (r, t) in enumerate(meta["channel_origin"])]
    return channel_roles(meta["nchannels"])


def _sweep(a) -> list[str]:
    from . import curves
    if a.nranks < 1:
        raise ValueError(f"-g {a.nranks}: need at least 1 rank")
    os.makedirs(a.out, exist_ok=True)
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                         "allreduce_vs_mpi.py")
    mpirun = os.path.join(os.path.dirname(sys.executable), "mpirun")
    subprocess.run([mpirun, "-n", str(a.nranks), sys.executable, bench, "-b", a.b, "-e", a.e, "-f", "2",
                    "--json", os.path.join(a.out, "bench.json")], check=True)
    return [curves.plot([os.path.join(a.out, "bench.json")], os.path.join(a.out, "curve.png"), a.title)]


if __name__ == "__main__":
    sys.exit(main())
