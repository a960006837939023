"""NCCL's cost model (``src/graph/tuning.cc``: ``ncclTopoTuneModel``, ``ncclTopoGetAlgoTime``; ``src/enqueue.cc``:
``updateCollCostTable``, ``topoGetAlgoInfo``'s choice), for any machine described by a ``Machine``.

Per (function, algorithm, protocol): a latency (base + hardware latency per step, §7.3) and a bandwidth (graph
channels x per-channel bandwidth with every correction, then bus -> algorithm bandwidth, §7.2), and
``time = lat * latCount + nBytes / (1000 * bw)`` µs.  The choice is the strictly smallest non-negative time in
(algorithm, protocol) order, so ties go to the lower algorithm id, then the lower protocol id.
NCCL stores latencies and bandwidths as ``float``; we round to float32 at the same points, so printed tables and
ties match.  The choice is among Tree and Ring.  The table carries every algorithm as NCCL fills it with collnet
off and no NVLS search: CollNet's latencies with no bandwidth, NVLS 0/0, PAT where ``ncclPatEnable`` allows it (one
GPU per node; deliberate difference: the choice leaves PAT out, the lab runs no PAT kernel).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from collectives.misc.param import env_int

from .tuning import ALGOS, FUNCS, PROTOS, TuningError, parse_list

f32 = np.float32
TREE, RING, COLLNET_DIRECT, COLLNET_CHAIN, PAT = 0, 1, 2, 3, 6
LL, LL128, SIMPLE = 0, 1, 2
NVLINK, PCI, NET = 0, 1, 2
# Path types (src/include/graph.h)
PATH = {"LOC": 0, "NVL": 1, "NVB": 2, "C2C": 3, "PIX": 4, "PXB": 5, "P2C": 6, "PXN": 7, "PHB": 8, "SYS": 9,
        "NET": 10, "DIS": 11}
PATTERN_TREE = 3
MAX_DEV_WORK_BATCH_COLLS = 8      # NCCL_MAX_DEV_WORK_BATCH_COLLS = 1024 / sizeof(ncclDevWorkColl) (128 B)
# treeCorrectionFactor[proto][log2(nBytes >> 6)]
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
)


@dataclass(frozen=True)
class TunerConstants:
    """``ncclTunerConstants_t`` defaults (``ncclTunerConstantsDefaults``); a tuner plugin may replace them."""
    base_latencies: tuple = ((6.8, 14.0, 8.4), (6.6, 14.0, 8.4), (0, 0, 0), (0, 0, 0), (0, 0, 0), (0, 0, 0),
                             (8.0, 8.0, 8.0))
    hw_latencies: tuple = (  # [NVLINK, PCI, NET][algo][proto]
        ((.6, 1.25, 4.0), (.6, 1.9, 3.4), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 25), (0, 0, 25), (0, 0, 4.0)),
        ((1.0, 1.9, 4.0), (1.0, 2.5, 5.7), (0, 0, 3.7), (0, 0, 2.8), (0, 0, 0), (0, 0, 0), (0, 0, 4.0)),
        ((5.0, 8.5, 14), (2.7, 4.0, 14.0), (0, 0, 31), (0, 0, 30), (0, 0, 18), (0, 0, 20.9), (0, 0, 14)),
    )
    ll_max_bws: tuple = ((39.0, 39.0, 20.4), (87.7, 22.5, 19.0), (141.0, 45.0, 35.0), (282.0, 90.0, 70.0))
    per_ch_max_ring_ll128_bws: tuple = ((20.0,) * 3, (20.0,) * 3, (36.7,) * 3, (40.0,) * 3)
    per_ch_max_tree_ll128_bws: tuple = ((20.0,) * 3, (20.0,) * 3, (36.7, 36.7, 29.0), (55.6, 31.67, 20.0))
    per_ch_max_tree_bws: tuple = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0), (70.0, 42.8, 24.0))


@dataclass(frozen=True)
class GraphFigures:
    """The figures of one pattern's search result that the tuning model reads (the fields of ``struct
    ncclTopoGraph`` that ``ncclTopoTuneModel`` uses; the search's own graph is ``search.Graph``)."""
    n_channels: int
    bw_intra: float              # GB/s per channel
    bw_inter: float
    type_intra: str = "NVL"      # path type names of src/include/graph.h
    type_inter: str = "PIX"
    latency_inter: float = 0.0
    same_channels: bool = True


@dataclass(frozen=True)
class Machine:
    name: str
    n_nodes: int
    gpus_per_node: int
    min_comp_cap: int
    ring: GraphFigures
    tree: GraphFigures
    max_comp_cap: int | None = None
    cpu_arch: str = "x86"        # x86 | power | arm
    cpu_vendor: str = "intel"    # intel | amd | mixed | other (the net overhead and LL caps depend on it)
    max_tree_pattern: int = 1    # NCCL_TOPO_PATTERN_BALANCED_TREE; 3 = TREE
    comm_channels: int | None = None   # comm->nChannels after Postset doubling (default 2 * min of the graphs)
    algorithms: tuple = ("Tree", "Ring")   # which algorithms the machine's library can run
    constants: TunerConstants = field(default_factory=TunerConstants)
    sources: dict = field(default_factory=dict)
    tuner: object | None = None  # a tuner plugin's getCollInfo (``cpu_tuner.CpuTuner``), applied after the table

    @property
    def n_ranks(self) -> int:
        return self.n_nodes * self.gpus_per_node


NO_GRAPH = GraphFigures(0, 0.0, 0.0, "LOC", "LOC", 0.0, False)   # a graph initTransportsRank zeroes, never searched


def log2i(n: int) -> int:
    """NCCL's ``log2i``: floor(log2(n)), -1 for 0."""
    return n.bit_length() - 1 if n > 0 else -1


def comp_cap_index(cc: int) -> int:
    return 3 if cc >= 100 else 2 if cc >= 90 else 1 if cc >= 80 else 0


def net_overhead(m: Machine, env: float | None = None) -> float:
    """``getNetOverhead`` (µs): NCCL_NET_OVERHEAD ns, else 1.0 Intel x86, 2.0 AMD x86, 1.0 otherwise."""
    if env is not None:
        return env * .001
    if m.cpu_arch == "x86" and m.cpu_vendor == "intel":
        return 1.0
    if m.cpu_arch == "x86" and m.cpu_vendor == "amd":
        return 2.0
    return 1.0


def pat_enable(m: Machine) -> bool:
    """``ncclPatEnable``: NCCL_PAT_ENABLE (default 2, automatic); never below sm60; automatic means one GPU per
    node (nNodes == nRanks) and a host network (the lab's only kind)."""
    if m.min_comp_cap < 60:
        return False
    env = env_int("NCCL_PAT_ENABLE", 2)
    if env != 2:
        return bool(env)
    return m.n_nodes == m.n_ranks


class AlgoInfo(NamedTuple):
    """What ``ncclGetAlgoInfo`` fixes for a collective before ``topoGetAlgoInfo``'s channel and thread counts:
    the algorithm, the protocol, the estimated time (us), and a tuner plugin's ``nChannels`` (0: none asked, NCCL
    keeps its own nMaxChannels)."""
    algo: str
    proto: str
    time: float
    n_channels: int = 0


class CostModel:
    """``comm->latencies`` / ``comm->bandwidths`` for one machine, and ``ncclTopoGetAlgoTime`` on them."""

    def __init__(self, machine: Machine, proto_env: str = "", algo_env: str = "", net_overhead_ns: float | None = None):
        self.m = m = machine
        # protoEnable: 1 for LL and Simple, 2 ("automatic") for LL128; NCCL_PROTO rewrites only the rows it names
        self.proto_enable = parse_list(proto_env, PROTOS, "NCCL_PROTO", initial={"LL": 1, "LL128": 2, "Simple": 1})
        self.algo_enable = parse_list(algo_env, ALGOS, "NCCL_ALGO")
        n, nodes = m.n_ranks, m.n_nodes
        c = m.constants
        self.comm_channels = m.comm_channels or 2 * min(m.ring.n_channels, m.tree.n_channels)
        self.lat = {f: [[0.0] * 3 for _ in ALGOS] for f in FUNCS}
        self.bw = {f: [[0.0] * 3 for _ in ALGOS] for f in FUNCS}
        if n <= 1:
            return
        cci = comp_cap_index(m.min_comp_cap)
        index2 = nodes - 1 if nodes <= 2 else 2
        index1 = cci if nodes == 1 else (1 if m.cpu_vendor in ("amd", "mixed") else 0)
        ll_max = c.ll_max_bws[index1][index2]
        tree_max = c.per_ch_max_tree_bws[cci][index2]
        ring_ll128_max = c.per_ch_max_ring_ll128_bws[cci][index2]
        tree_ll128_max = c.per_ch_max_tree_ll128_bws[cci][index2]
        hw_lat = [[list(row) for row in table] for table in c.hw_latencies]
        if m.cpu_arch == "power":  # de-penalize Tree/Simple on Power
            hw_lat[PCI][TREE][SIMPLE] = hw_lat[PCI][RING][SIMPLE]
        ppn = f32(n / nodes)
        ppn_i = n // nodes
        pat_on = pat_enable(m)
        # graphs[] as initTransportsRank passes them: CollNet's are never searched here (collnet off: zeroed),
        # NVLS's neither (no multicast: zero channels, so NCCL skips it), PAT reads the tree graph
        graphs = {TREE: m.tree, RING: m.ring, COLLNET_DIRECT: NO_GRAPH, COLLNET_CHAIN: NO_GRAPH, PAT: m.tree}
        intra_hw = {a: NVLINK if g.type_intra == "NVL" else PCI for a, g in graphs.items()}
        hw = {a: intra_hw[a] if nodes == 1 else NET for a in graphs}
        for func in FUNCS:
            nsteps = 2 * (n - 1) if func == "AllReduce" else n - 1 if func in ("ReduceScatter", "AllGather") else n
            for a, g in graphs.items():
                if func in ("Broadcast", "Reduce") and a != RING:
                    continue
                if func in ("ReduceScatter", "AllGather") and a not in (PAT, RING, COLLNET_DIRECT):
                    continue
                if func == "AllReduce" and a == PAT:
                    continue
                for p in range(3):
                    if a == PAT and (p != SIMPLE or not pat_on):
                        continue
                    bw = g.bw_intra if nodes <= 2 or a in (COLLNET_DIRECT, COLLNET_CHAIN) else g.bw_inter
                    bus = f32(g.n_channels * bw)
                    if a == RING and p == LL:
                        bus = f32(min(ll_max, float(bus) * .5))
                    if a == RING and p == LL128:
                        bus = f32(min(float(bus) * 0.92, g.n_channels * ring_ll128_max))
                    if a == TREE and func == "AllReduce":
                        bus = f32(min(float(bus) * .92, g.n_channels * tree_max))
                    if a == TREE and p == LL:
                        bus = f32(min(float(bus) * 1.0 / 3.8, ll_max))
                    if a == TREE and p == LL128:
                        bus = f32(min(float(bus) * (7.0 / 9.0 if nodes == 1 else 120.0 / 128.0),
                                      g.n_channels * tree_ll128_max))
                    if a == TREE and m.max_tree_pattern == PATTERN_TREE:
                        bus = f32(float(bus) * .85)  # float *= double: computed in double
                    if a == PAT:
                        bus = f32(float(bus) * .75)
                    if a in (COLLNET_DIRECT, COLLNET_CHAIN):
                        bus = f32(0.0)   # no CollNet graph: no channels, and collnet is off (zeroed below anyway)
                    if not (a != RING and func in ("AllGather", "ReduceScatter")):
                        ratio = f32(1.0 * n / nsteps) if a == RING else f32(.5)
                        bus = f32(bus * ratio)
                    self.bw[func][a][p] = bus
                    lat = f32(c.base_latencies[a][p])
                    intra_lat = f32(hw_lat[intra_hw[a]][a][p])
                    inter_lat = f32(hw_lat[NET][TREE if ppn == 1 else a][p])
                    inter_lat = f32(inter_lat + f32(g.latency_inter))
                    if p == SIMPLE:
                        inter_lat = f32(inter_lat + f32(g.latency_inter))
                    if a == RING:
                        step_lat = f32(hw_lat[hw[a]][a][p])
                        if func in ("Reduce", "Broadcast"):
                            if g.same_channels:
                                lat = f32(lat + step_lat)
                            else:
                                if p == SIMPLE:
                                    step_lat = f32(hw_lat[hw[a]][TREE][p])
                                lat = f32(lat + f32(nsteps * step_lat))
                        else:
                            overhead = f32(0.0)
                            if nodes > 1:
                                overhead = f32(net_overhead(m, net_overhead_ns))
                                if p == SIMPLE:
                                    overhead = f32(overhead * 3)
                            intra_lat = max(intra_lat, overhead)
                            inter_steps = 0 if nodes == 1 else (2 * (nodes - 1) if func == "AllReduce" else nodes - 1)
                            lat = f32(lat + f32(f32((nsteps - inter_steps) * intra_lat) + f32(inter_steps * inter_lat)))
                    elif a == TREE and func == "AllReduce":
                        lat = f32(lat + f32(2 * f32(f32((ppn_i - 1) * intra_lat) + f32(log2i(nodes) * inter_lat))))
                    elif a == COLLNET_DIRECT:   # 0.4 us per local rank: the sum is a double, added to the float
                        lat = f32(float(lat) + (2 * (float(f32(min(1, ppn_i - 1) * intra_lat)) + (ppn_i - 1) * 0.4)
                                                + float(inter_lat)))
                    elif a == COLLNET_CHAIN:
                        lat = f32(lat + f32(f32(2 * (ppn_i - 1) * intra_lat) + inter_lat))
                    elif a == PAT:
                        lat = f32(float(lat) + (log2i(nodes) * (float(inter_lat) / 3.5) + n * 2.8))
                    self.lat[func][a][p] = lat
        self._apply_enables()

    def _ll128_auto(self, g: GraphFigures) -> bool:
        """LL128 "auto" (``protoEnable == 2``): Hopper+ up to PXN (NCCL_LL128_C2C=1), else up to PXB; NVB intra;
        same compute capability or >= 90; compute capability >= 70."""
        m = self.m
        min_cc, max_cc = m.min_comp_cap, m.max_comp_cap or m.min_comp_cap
        ok = PATH[g.type_inter] <= (PATH["PXN"] if min_cc >= 90 else PATH["PXB"])
        ok &= PATH[g.type_intra] <= PATH["NVB"]
        ok &= min_cc == max_cc or min_cc >= 90
        ok &= min_cc >= 70
        return bool(ok)

    def _apply_enables(self) -> None:
        """The enable pass: NCCL_PROTO / NCCL_ALGO, LL128's automatic rule, and the algorithms NCCL turns off here
        (CollNet: collnet off; NVLS: never searched).  Only bandwidths are zeroed; latencies stay as computed."""
        graphs = {TREE: self.m.tree, RING: self.m.ring, PAT: self.m.tree}
        for func in FUNCS:
            for a, algo in enumerate(ALGOS):
                if a in (TREE, RING):
                    usable = algo in self.m.algorithms and self.algo_enable[func][algo]
                else:
                    usable = a == PAT and bool(self.algo_enable[func][algo])
                for p, proto in enumerate(PROTOS):
                    on = self.proto_enable[func][proto]
                    if on is not True and on == 2 and p == LL128:
                        on = self._ll128_auto(graphs.get(a, NO_GRAPH))
                    if not (on and usable):
                        self.bw[func][a][p] = f32(0.0)

    def algo_usable(self, func: str, algo: str) -> bool:
        """The machine runs ``algo`` and ``NCCL_ALGO`` allows it for ``func``."""
        return algo in self.m.algorithms and self.algo_enable[func][algo]

    def time(self, func: str, a: int, p: int, nbytes: int, num_pipe_ops: int = 1) -> float:
        """``ncclTopoGetAlgoTime`` (µs); -1 when unavailable."""
        if a >= 2:
            return -1.0
        bw, lat = self.bw[func][a][p], self.lat[func][a][p]
        if bw == 0:
            return -1.0
        log_size = log2i(nbytes >> 6)
        if a == TREE and func == "AllReduce" and 0 <= log_size < 23:
            bw = f32(bw * f32(TREE_CORRECTION[p][log_size]))
        if (a == RING and p == SIMPLE and self.m.n_nodes > 1 and func == "AllReduce"
                and nbytes // (self.comm_channels * self.m.n_ranks) >= 64):
            lat = f32(float(lat) * (1.9 if self.m.min_comp_cap < 80 else 1.4))  # float *= double
        lat_count = num_pipe_ops if a == RING else math.ceil(num_pipe_ops / MAX_DEV_WORK_BATCH_COLLS)
        # size_t / float: nBytes is converted to float, and 1000 * bw is a float product
        return float(f32(f32(lat * f32(lat_count)) + f32(f32(nbytes) / f32(f32(1000) * bw))))

    def table(self, func: str, nbytes: int, num_pipe_ops: int = 1) -> dict:
        """{(algo, proto): time} for the algorithms this model knows (Tree, Ring)."""
        return {(ALGOS[a], PROTOS[p]): self.time(func, a, p, nbytes, num_pipe_ops) for a in (TREE, RING)
                for p in range(3)}

    def choose(self, func: str, nbytes: int, num_pipe_ops: int = 1, reg_buff: bool = False) -> AlgoInfo:
        """``topoGetAlgoInfo``: the strictly smallest non-negative time, ties to the lower (algo, proto) ids; a
        tuner plugin's ``getCollInfo`` edits the table first (``ncclGetAlgoInfo``), told ``regBuff``: whether
        the call's send and receive buffers are both registered, and may ask a channel count."""
        if self.m.n_ranks == 1:
            return AlgoInfo("Ring", "Simple", 0.0)
        table = self.table(func, nbytes, num_pipe_ops)
        n_channels = 0
        if self.m.tuner is not None:
            n_channels = self.m.tuner.get_coll_info(func, nbytes, table, reg_buff)
        best, best_t = None, float("inf")
        for (algo, proto), t in table.items():
            if 0.0 <= t < best_t:
                best, best_t = (algo, proto), t
        if best is None:
            raise TuningError(f"No algorithm/protocol available for function {func} on {self.m.name} "
                              f"(NCCL_ALGO/NCCL_PROTO and the machine leave nothing)")
        return AlgoInfo(best[0], best[1], best_t, n_channels)

    def tuning_lines(self, max_threads: dict | None = None) -> list[str]:
        """The NCCL_DEBUG_SUBSYS=TUNING table of rank 0, as ``ncclTopoTuneModel`` prints it: the seven algorithms
        in blocks of three, each block an ``Algorithm`` row, a ``Protocol`` row (always nine columns), a
        ``Max NThreads`` row (``comm->maxThreads``) and one ``lat/bw`` row per function (``%8.1f/%6.1f``).
        CollNet prints its latencies with no bandwidth (collnet off), NVLS 0.0/0.0 (not searched), PAT what
        ``ncclPatEnable`` allows."""
        threads = max_threads or {}
        lines = []
        for block in range(0, len(ALGOS), 3):
            algos = range(block, min(block + 3, len(ALGOS)))
            lines.append("  Algorithm   |" + "".join(f" {'':>14}   {ALGOS[a]:>14}   {'':>14} |" for a in algos))
            lines.append("  Protocol    |" + "".join(f" {p:>14} |" for _ in range(3) for p in PROTOS))
            lines.append(" Max NThreads |" + "".join(f" {threads.get((ALGOS[a], p), 0):14d} |" for a in algos
                                                   for p in PROTOS))
            for func in FUNCS:
                row = f"{func:>13} |"
                for a in algos:
                    for p in range(3):
                        lat, bw = self.lat[func][a][p], self.bw[func][a][p]
                        row += f"{float(lat):8.1f}/{float(bw):6.1f} |"
                lines.append(row)
        return lines
