"""``python -m collectives.tools.tune``: NCCL's cost model for a machine, size by size, with the reason for each choice.

    python -m collectives.tools.tune --preset dgx-h100 -b 8 -e 1G -f 4
    python -m collectives.tools.tune --nodes 2 --gpus 8 --cc 90 --intra NVL --ring-channels 12 --ring-bw 30 -b 1G -e 1G
    python -m collectives.tools.tune --preset dgx-a100 --coll allgather --json rows.json --series h100.json
    python -m collectives.tools.tune --topo topologies/azure-ndv5-topo.xml --sm 90 -b 8 -e 1G -f 4
    python -m collectives.tools.tune --topo topologies/azure-ndv4-topo.xml --sm 80 --nodes 2

For every size it prints the predicted time and bus bandwidth of each (algorithm, protocol), marks the winner
(``topoGetAlgoInfo``'s strict minimum) and says which term decides: the latency or the bandwidth, and by how
much the runner-up loses.  ``--json`` writes the rows (size, algo, proto, time_us, algbw, busbw, chosen);
``--series`` writes the winner's predicted busbw per size, for the curves tool.
"""
from __future__ import annotations

import argparse
import json
import sys

from collectives.graph import tuning
from collectives.graph.cost_model import CostModel, GraphFigures, Machine
from collectives.graph.tuning import ALGOS
from collectives.graph.presets import PRESETS, preset
from collectives.perf.colls import BY_CLI, COLLECTIVES
from collectives.perf.args import parse_size, sizes


def machine_from_args(a) -> Machine:
    if a.topo:
        from collectives.graph.topo_xml import StandIns, TopoError
        if a.preset:
            raise TopoError("--topo describes the machine itself (no --preset)")
        stand = StandIns(sm=a.sm, nvlinks=a.nvlinks)
        shape = f"{a.topo}{f' --sm {a.sm}' if a.sm else ''}"
        if (a.nodes or 1) > 1:
            from collectives.graph.init_cluster import run_cluster
            from collectives.graph.topo_feed import cluster_machine
            c = run_cluster(a.topo, a.nodes, a.gpus, stand)
            return cluster_machine(c, f"topology {a.topo} x{a.nodes}",
                                   {"graph": f"NCCL's multi-node search over {a.topo} (python -m "
                                             f"collectives.tools.topology {shape} --nodes {a.nodes}"
                                             f"{f' --nranks {a.gpus}' if a.gpus else ''}), graphs aligned as "
                                             f"AllGather3 aligns them"})
        from collectives.graph.init_topo import run_topology
        from collectives.graph.topo_feed import machine
        r = run_topology(a.topo, a.gpus, stand)
        return machine(r, f"topology {a.topo}", {"graph": f"NCCL's search over {a.topo} (python -m "
                                                        f"collectives.tools.topology {shape})"})
    if a.preset:
        m = preset(a.preset, nodes=a.nodes or 1, nranks=a.gpus or 8)
        if a.gpus and a.preset != "cpu":
            m = Machine(**{**m.__dict__, "gpus_per_node": a.gpus})
        return m
    ring = GraphFigures(a.ring_channels, a.ring_bw, a.ring_bw_inter or a.ring_bw, a.intra, a.inter)
    tree = GraphFigures(a.tree_channels or a.ring_channels, a.tree_bw or a.ring_bw,
                 a.tree_bw_inter or a.tree_bw or a.ring_bw, a.intra, a.inter)
    return Machine("custom", a.nodes or 1, a.gpus or 8, a.cc, ring=ring, tree=tree, cpu_vendor=a.cpu_vendor)


def explain(rows: list[dict], nbytes: int) -> str:
    live = sorted((r for r in rows if r["time_us"] >= 0), key=lambda r: r["time_us"])
    if not live:
        return "nothing is available"
    win = live[0]
    lat_part = win["lat_us"]
    bw_part = win["time_us"] - lat_part
    term = "latency" if lat_part >= bw_part else "bandwidth"
    text = (f"{win['algo']}/{win['proto']}: {term} term dominates ({lat_part:.1f} us latency + {bw_part:.1f} us "
            f"for {nbytes} B at {win['bw_model']:.1f} GB/s)")
    if len(live) > 1:
        second = live[1]
        text += (f"; runner-up {second['algo']}/{second['proto']} is {second['time_us'] - win['time_us']:.1f} us "
                 f"({(second['time_us'] / win['time_us'] - 1) * 100:.0f}%) slower")
    return text


def predict(model: CostModel, func: str, nbytes: int) -> list[dict]:
    algo, proto = model.choose(func, nbytes)[:2]
    n = model.m.n_ranks
    rows = []
    for (a, p), t in model.table(func, nbytes).items():
        ai, pi = ("Tree", "Ring").index(a), ("LL", "LL128", "Simple").index(p)
        algbw = nbytes / (t * 1e3) if t > 0 else 0.0
        rows.append({"size": nbytes, "algo": a, "proto": p, "time_us": t, "algbw": algbw,
                     "busbw": algbw * COLLECTIVES[func].bus_factor(n), "chosen": (a, p) == (algo, proto),
                     "lat_us": float(model.lat[func][ai][pi]), "bw_model": float(model.bw[func][ai][pi])})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m collectives.tools.tune", description=__doc__.split("\n")[0])
    p.add_argument("--preset", choices=sorted(PRESETS))
    p.add_argument("--topo", metavar="XML", help="take the graphs from NCCL's search over this node's topology "
                                                  "(with --nodes K: K such nodes, the multi-node search)")
    p.add_argument("--sm", type=int, help="with --topo: compute capability of GPUs the file leaves bare")
    p.add_argument("--nvlinks", type=int, help="with --topo: NVLinks per GPU when the file has none")
    p.add_argument("--nodes", type=int)
    p.add_argument("--gpus", "--nranks", dest="gpus", type=int, help="GPUs (ranks) per node")
    p.add_argument("--cc", type=int, default=90, help="minimum compute capability, e.g. 80, 90, 100")
    p.add_argument("--intra", default="NVL", help="intra-node path type: NVL, PIX, PXB, PHB, SYS")
    p.add_argument("--inter", default="PIX", help="GPU-NIC path type (LL128 auto-enable): PIX, PXB, PXN, ...")
    p.add_argument("--ring-channels", type=int, default=12)
    p.add_argument("--ring-bw", type=float, default=30.0, help="ring graph bw per channel, GB/s (intra)")
    p.add_argument("--ring-bw-inter", type=float)
    p.add_argument("--tree-channels", type=int)
    p.add_argument("--tree-bw", type=float)
    p.add_argument("--tree-bw-inter", type=float)
    p.add_argument("--cpu-vendor", default="intel", choices=["intel", "amd", "mixed", "other"])
    p.add_argument("--coll", choices=sorted(BY_CLI), default="allreduce")
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("1G"))
    p.add_argument("-f", "--stepfactor", type=int, default=4)
    p.add_argument("-i", "--stepbytes", type=parse_size, default=parse_size("1M"))
    p.add_argument("--proto", default="", help="NCCL_PROTO restriction (NCCL's grammar)")
    p.add_argument("--algo", default="", help="NCCL_ALGO restriction")
    p.add_argument("--json", metavar="FILE", help="rows as JSON ('-' for stdout)")
    p.add_argument("--series", metavar="FILE", help="the chosen (algo, proto)'s predicted busbw per size, JSON")
    a = p.parse_args(argv)
    try:
        for flag in ("gpus", "nodes"):
            if getattr(a, flag) is not None and getattr(a, flag) < 1:
                raise ValueError(f"--{flag} {getattr(a, flag)}: must be at least 1")
        machine = machine_from_args(a)
    except ValueError as e:   # TopoError is a ValueError; bad presets too
        print(f"python -m collectives.tools.tune: {e}", file=sys.stderr)
        return 2
    model = CostModel(machine, a.proto, a.algo)
    func = BY_CLI[a.coll].name
    out = sys.stdout if a.json != "-" else sys.stderr
    print(f"# {func} on {machine.name}: {machine.n_nodes} node(s) x {machine.gpus_per_node}, cc {machine.min_comp_cap},"
          f" ring {machine.ring.n_channels} x {machine.ring.bw_intra:g} GB/s, tree {machine.tree.n_channels} x "
          f"{machine.tree.bw_intra:g} GB/s", file=out)
    for key, src in machine.sources.items():
        print(f"# source ({key}): {src}", file=out)
    for line in model.tuning_lines(tuning.max_threads(machine.ring.bw_intra, machine.ring.n_channels)):
        print(f"# {line}", file=out)
    if any(model.bw[f][ALGOS.index("PAT")][2] > 0 for f in model.bw):
        print("# PAT has bandwidth (one GPU per node): NCCL would weigh it for AllGather/ReduceScatter; the choice "
              "below is among Tree and Ring", file=out)
    combos = [(al, pr) for al in ("Tree", "Ring") for pr in ("LL", "LL128", "Simple")]
    print(f"# {'size':>12} " + " ".join(f"{al + '/' + pr:>20}" for al, pr in combos), file=out)
    print(f"# {'(B)':>12} " + " ".join(f"{'time(us) busbw':>20}" for _ in combos), file=out)
    all_rows, series = [], []
    for nbytes in sizes(a):
        rows = predict(model, func, nbytes)
        all_rows.extend(rows)
        cells = []
        for r in rows:
            cell = "-" if r["time_us"] < 0 else f"{r['time_us']:9.1f} {r['busbw']:7.1f}{'*' if r['chosen'] else ' '}"
            cells.append(f"{cell:>20}")
        print(f"  {nbytes:>12} " + " ".join(cells), file=out)
        print(f"  {'':>12} -> {explain(rows, nbytes)}", file=out)
        win = next(r for r in rows if r["chosen"])
        series.append({"size": nbytes, "busbw": win["busbw"], "algbw": win["algbw"], "algo": win["algo"],
                       "proto": win["proto"]})
    public = [{k: r[k] for k in ("size", "algo", "proto", "time_us", "algbw", "busbw", "chosen")} for r in all_rows]
    if a.json:
        text = json.dumps(public, indent=1)
        if a.json == "-":
            print(text)
        else:
            with open(a.json, "w") as f:
                f.write(text + "\n")
    if a.series:
        with open(a.series, "w") as f:
            json.dump({"label": f"NCCL model: {machine.name}", "coll": func, "points": series}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
