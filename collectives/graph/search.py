"""NCCL's graph search (``src/graph/search.cc``: ``ncclTopoCompute``, ``ncclTopoSearchRec``,
``ncclTopoSearchRecGpu``, ``ncclTopoSearchTryGpu``, ``ncclTopoSearchNextGpuSort``, ``ncclTopoFollowPath``,
``followPath``, ``ncclTopoCompareGraphs``, ``ncclTopoSearchTryNvls``, ``ncclTopoDupChannels``,
``ncclTopoPrintGraph``; across nodes ``ncclTopoSearchRecNet``, ``ncclTopoSearchParams``,
``ncclTopoSearchCheckNet``; the NIC lists are in nets.py).

The search is a depth-first walk that builds one channel (an ordered list of every GPU) at a time, each hop
subtracting the channel's bandwidth from every link on its path (``followPath``; undone on the way back), and
stops a channel that would overdraw a link.  ``ncclTopoCompute`` runs it from the fastest speed of the per-SM speed
array down, relaxing sameChannels, the tree pattern and the path type, within step budgets (timeouts), then
doubles fast channels (``ncclTopoDupChannels``) and tries to raise the speed again (pass 2).

The recursion (``ncclTopoSearchRec`` -> ``TryGpu`` -> ``RecGpu`` -> ... -> the next channel's ``Rec``) is NCCL's
call for call, but as generators run on an explicit stack (``Search.run``): in C it is channels x GPUs frames
deep, past Python's recursion limit from 64 GPUs.

Across nodes (``system.inter``) each channel starts at a NET, visits the node's GPUs and goes back to a NET
(``ncclTopoSearchRecNet``), with the inter-node speed arrays, typeInter widened up to the GPUs' worst NET path and
crossNic 0/1/2 (NCCL_CROSS_NIC).  Not ported on purpose: CollNet (no SHARP plugin), NCCL_GRAPH_FILE.

Ours, for speed, with the same steps and the same graphs: what depends on paths alone (the NIC lists, the GPUs
closest to a NIC, the fixed part of the next-GPU scores) is worked out once per ``Search``, and followPath's walk of
a path's links once per path, since the search changes the bandwidth left on links and NICs and never a path; NCCL's
C recomputes them at each step.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from collectives.include.bitops import div_up
from collectives.include.device import MAXCHANNELS

from .nets import gpu_pci_bw, gpu_pci_links, net_index, select_nets
from .paths import get_local, gpu_min_max_path
from .topo import (ARCH_POWER, ARCH_X86, CPU, DEV, GPU, LINK_NVL, LINK_PCI, NET, NVS, PATH_DIS, PATH_LOC,
                   PATH_PHB, PATH_PIX, PATH_PXN, PATH_SYS, PATH_TYPES, VENDOR_AMD, VENDOR_INTEL, System, f32)

BALANCED_TREE, SPLIT_TREE, TREE, RING, NVLS, COLLNET_DIRECT = 1, 2, 3, 4, 5, 6
PATTERN_NAMES = {1: "BALANCED_TREE", 2: "SPLIT_TREE", 3: "TREE", 4: "RING", 5: "NVLS", 6: "COLLNET_DIRECT"}
NCCL_MAX_NVLS_ARITY = 32
GLOBAL_TIMEOUT = 1 << 19
TIMEOUT = 1 << 14
TIMEOUT_TREE = 1 << 14
TIMEOUT_SAMECHANNELS = 1 << 8
FORCED_ORDER_PCI, FORCED_ORDER_REPLAY = 1, 2

SPEED_INTRA = (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0)
SPEED_INTRA_SM90 = (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0)
SPEED_INTRA_SM100 = (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0)
SPEED_INTER = (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.4, 1.2,
               0.24, 0.12)
SPEED_INTER_SM90 = (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4, 1.2, 0.24,
                    0.12)
SPEED_INTER_SM100 = (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0,
                     3.0, 2.4, 1.2, 0.24, 0.12)


def speed_array(cc_min: int, inter: int = 0) -> tuple:
    """The speeds ``ncclTopoCompute`` tries, by the smallest compute capability and whether NETs are in the
    channel (C float arrays: each value as a float32)."""
    if inter:
        speeds = SPEED_INTER_SM100 if cc_min >= 100 else SPEED_INTER_SM90 if cc_min >= 90 else SPEED_INTER
        return tuple(f32(x) for x in speeds)
    return SPEED_INTRA_SM100 if cc_min >= 100 else SPEED_INTRA_SM90 if cc_min >= 90 else SPEED_INTRA


@dataclass
class Graph:
    """``ncclTopoGraph``: ``intra[c]`` is channel c's GPU ranks in order; bandwidths per channel in GB/s."""
    id: int
    pattern: int
    min_channels: int = 1
    max_channels: int = MAXCHANNELS // 2
    cross_nic: int = 0
    n_channels: int = 0
    bw_intra: float = 0.0
    bw_inter: float = 0.0
    latency_inter: float = 0.0
    type_intra: int = PATH_LOC
    type_inter: int = PATH_PIX
    same_channels: int = 0
    n_hops: int = 0
    coll_net: int = 0
    fallback: bool = False       # the search found nothing: NCCL's "falling back to simple order"
    intra: list = field(default_factory=lambda: [[] for _ in range(MAXCHANNELS)])
    inter: list = field(default_factory=lambda: [[-1, -1] for _ in range(MAXCHANNELS)])

    def copy(self) -> "Graph":
        g = Graph(**{k: v for k, v in self.__dict__.items() if k not in ("intra", "inter")})
        g.intra = [list(c) for c in self.intra]
        g.inter = [list(c) for c in self.inter]
        return g

    def channels(self) -> list[list[int]]:
        return [list(self.intra[c]) for c in range(self.n_channels)]


def _roundf(x: float) -> float:
    return math.copysign(math.floor(abs(x) + 0.5), x)


_SUB_CACHE: dict = {}


def _sub_round(a: float, b: float) -> float:
    """``SUB_ROUND``: a - b kept to three decimals, in float (memoised: the search repeats the same few pairs)."""
    key = (a, b)
    out = _SUB_CACHE.get(key)
    if out is None:
        if len(_SUB_CACHE) > 1 << 20:
            _SUB_CACHE.clear()
        out = _SUB_CACHE[key] = f32(_roundf(f32(f32(a - b) * 1000)) / 1000)
    return out


def _cmp_score(s: tuple) -> tuple:
    """``cmpScore`` on (GPU, distance, intra hops, intra bw, inter bw, inter PCI bw, inter hops): interBw desc,
    interPciBw desc, interNhops asc, intraBw desc, intraNhops asc, startIndex asc."""
    return (-s[4], -s[5], s[6], -s[3], s[2], s[1])


class Search:
    """One ``ncclTopoCompute`` over a system; ``time`` is NCCL's step budget shared by the recursion."""

    def __init__(self, system: System):
        self.s = system
        self.time = 0
        # Paths are fixed for the whole search (it takes bandwidth from links and NICs, never from paths), so what
        # depends on paths alone is computed once per search, not on each of its millions of steps (ours: NCCL's C
        # walks these lists each time, where it costs nanoseconds).  followPath's plan is kept on the path itself.
        self._memo: dict = {}

    def _once(self, key: tuple, make):
        """``make()``'s value for ``key``, computed on the first ask of this search only."""
        value = self._memo.get(key)
        if value is None:
            value = self._memo[key] = make()
        return value

    def select_nets(self, type_inter: int, gpu: int) -> tuple:
        """``ncclTopoSelectNets`` (nets.py), once per search for each (typeInter, GPU)."""
        return self._once(("nets", type_inter, gpu), lambda: tuple(select_nets(self.s, type_inter, gpu)))

    def net_index(self, net_id: int) -> int:
        """``getNetIndex`` (nets.py), once per search for each NET id."""
        return self._once(("net", net_id), lambda: net_index(self.s, net_id))

    def gpu_pci_bw(self, g: int) -> int:
        """``gpuPciBw`` (nets.py): the bandwidth is what the search left on the links, read each time; the two
        links are found once."""
        return gpu_pci_bw(self._once(("pci", g), lambda: gpu_pci_links(self.s.nodes[GPU][g])))

    def get_local(self, t: int, index: int, result_t: int) -> tuple:
        """``ncclTopoGetLocal`` (paths.py), once per search for each node and result type."""
        def make():
            gpus, path_type = get_local(self.s, t, index, result_t)
            return tuple(gpus), path_type
        return self._once(("local", t, index, result_t), make)

    # --- links -----------------------------------------------------------------------------------------------
    @staticmethod
    def _plan(path, start) -> tuple:
        """What ``followPath`` looks at on each link of ``path`` from ``start``, none of which the search changes
        (ours: worked out once per path instead of on every step): whether it crosses an Intel x86 CPU, and per
        link (link, is PCI, its reverse link or None, whether the link enters a pre-Ampere GPU (sm < 80: the
        reverse link pays fw/8), whether it is a POWER CPU's NVLink (the reverse pays fw)).  Kept on the path, with
        the link list it was made from (paths.py gives a path a new list whenever it changes its links)."""
        plan = path.__dict__.get("follow_plan")
        if plan is not None and plan[0] is path.links:
            return plan
        intel = any(lk.rem.type == CPU and lk.rem.arch == ARCH_X86 and lk.rem.vendor == VENDOR_INTEL
                    for lk in path.links)
        steps, node = [], start
        for link in path.links:
            old_gpu = link.rem.type == DEV and link.rem.sm < 80 and start.type != GPU
            power = link.rem.type == CPU and link.rem.arch == ARCH_POWER and link.type == LINK_NVL
            rev = next(lk for lk in link.rem.links if lk.rem is node and lk.type == link.type) \
                if old_gpu or power else None
            steps.append((link, link.type == LINK_PCI, rev, old_gpu, power))
            node = link.rem
        plan = path.follow_plan = (path.links, intel, steps)
        return plan

    def _follow(self, path, start, max_steps: int, bw: float) -> int:
        """``followPath``: subtract ``bw`` along the first ``max_steps`` links; return how many fitted."""
        _, intel, steps = self._plan(path, start)
        pci_bw = bw
        if intel and path.type == PATH_PHB and start.type == GPU:
            pci_bw = f32(f32(bw * 6) / 5)   # INTEL_P2P_OVERHEAD: GPU P2P through an Intel CPU costs 6/5
        for step in range(max_steps):
            link, is_pci, rev, old_gpu, power = steps[step]
            fw = pci_bw if is_pci else bw
            if rev is None:
                if link.bw < fw:
                    return step
                link.bw = _sub_round(link.bw, fw)
                continue
            rev_bw = 0.0
            if old_gpu:
                rev_bw = f32(rev_bw + f32(fw / 8))
            if power:
                rev_bw = f32(rev_bw + fw)
            if link.bw < fw or (rev_bw and rev.bw < rev_bw):
                return step
            link.bw = _sub_round(link.bw, fw)
            if rev_bw:
                rev.bw = _sub_round(rev.bw, rev_bw)
        return max_steps

    def follow_path(self, graph: Graph, t1: int, i1: int, t2: int, i2: int, mult: float):
        """``ncclTopoFollowPath``: take (mult > 0) or give back (mult < 0) the path's bandwidth; the target
        node, or None when the path is too slow, of a worse type than the graph allows, or overdrawn."""
        target = self.s.nodes[t2][i2]
        if t1 == -1:
            return target
        node1 = self.s.nodes[t1][i1]
        path = node1.paths[t2][i2]
        rev_path = target.paths[t1][i1]
        intra = t1 in (GPU, NVS) and t2 in (GPU, NVS)
        bw = graph.bw_intra if intra else graph.bw_inter
        type_ = graph.type_intra if intra else graph.type_inter
        if path.type >= PATH_DIS:
            return None
        if mult == 1 and path.type > type_:
            return None
        if mult == 1 and graph.pattern in (BALANCED_TREE, TREE, SPLIT_TREE) and rev_path.type > type_:
            return None
        bw = bw * mult if mult in (1, -1, 2, -2) else f32(bw * mult)   # exact for +-1, +-2
        count = len(path.links)
        step = self._follow(path, node1, count, bw)
        if step < count:
            self._follow(path, node1, step, -bw)
            return None
        graph.n_hops += int(mult * count)
        return target

    # --- GPU order -------------------------------------------------------------------------------------------
    def _next_gpus(self, start: int, net: int) -> list[tuple]:
        """``ncclTopoSearchNextGpuSort``'s candidates from GPU ``start``, as ``_cmp_score`` reads them: (GPU,
        distance, intra hops, intra bandwidth, inter bandwidth, inter PCI bandwidth, inter hops), the inter fields
        from NET ``net`` when >= 0 (NCCL's getNetPaths), else 0.  Paths only, so once per search; without a NET
        that is the whole score, already in cmpScore's order."""
        gpus = self.s.nodes[GPU]
        n = len(gpus)
        paths = gpus[start].paths[GPU]
        net_paths = self.s.nodes[NET][net].paths[GPU] if net >= 0 else None
        out = []
        for i in range(1, n):
            g = (start + i) % n
            if paths[g].count == 0:
                continue
            # the inter PCI bandwidth (slot 5) is live: 0 here, filled in by next_gpu_sort when there is a NET
            inter = (int(net_paths[g].bw), 0, net_paths[g].count) if net >= 0 else (0, 0, 0)
            out.append((g, i, paths[g].count, int(paths[g].bw)) + inter)
        if net < 0:
            out.sort(key=_cmp_score)
        return out

    def next_gpu_sort(self, graph: Graph, gpu, sort_net: int) -> list[int]:
        """``ncclTopoSearchNextGpuSort``: candidates by bandwidth then hops then distance from ``gpu``; with
        NVSwitches only the next (ring) or previous (trees) GPU in index order is tried."""
        flag = 1 << graph.n_channels
        gpus = self.s.nodes[GPU]
        n = len(gpus)
        start = gpus.index(gpu)
        net = self.net_index(graph.inter[graph.n_channels][0]) if sort_net else -1
        cands = self._once(("order", start, net), lambda: self._next_gpus(start, net))
        if net < 0:   # dropping the GPUs this channel used keeps the (stable) sorted order
            scores = [c for c in cands if not gpus[c[0]].used & flag]
        else:         # a GPU's PCI bandwidth left is live (followPath takes from it): score and sort each time
            scores = [c[:5] + (self.gpu_pci_bw(c[0]), c[6]) for c in cands if not gpus[c[0]].used & flag]
            scores.sort(key=_cmp_score)
        same = all(s[3] == scores[0][3] and s[2] == scores[0][2] for s in scores) if scores else True
        nxt = [s[0] for s in (reversed(scores) if sort_net == -1 and same else scores)]
        count = len(nxt)
        if self.s.nodes[NVS]:
            prev_g, next_g = (start - 1 + n) % n, (start + 1) % n
            if graph.pattern == RING:
                first = [next_g, prev_g]
            elif graph.pattern in (SPLIT_TREE, BALANCED_TREE):
                first = [prev_g, next_g]
            else:
                first = [next_g]
            if next_g == prev_g and len(first) == 2:
                first = first[:1]
            real = 0
            for f in first:
                if f in nxt[:count]:
                    nxt.remove(f)
                    nxt.insert(0, f)
                    real += 1
            count = real
        return nxt[:count]

    # --- recursion -------------------------------------------------------------------------------------------
    # Each recursive function is a generator that yields the call it would make (see the module docstring).
    @staticmethod
    def run(call) -> None:
        """Run a generator-coded recursion to its end on an explicit stack (``yield f(...)`` is a call of f)."""
        stack = [call]
        while stack:
            try:
                sub = next(stack[-1])
            except StopIteration:
                stack.pop()
                continue
            stack.append(sub)

    def try_gpu(self, graph, save, step, back_net, back_first, forced, t, i, g):
        """``ncclTopoSearchTryGpu``."""
        flag = 1 << graph.n_channels
        gpu = self.follow_path(graph, t, i, GPU, g, 1)
        if gpu is not None:
            gpu.used ^= flag
            yield self.rec_gpu(graph, save, gpu, step, back_net, back_first, forced)
            gpu.used ^= flag
            self.follow_path(graph, t, i, GPU, g, -1)

    def replay_gpu(self, graph: Graph, step: int) -> int:
        """``ncclTopoReplayGetGpu``: the GPU the previous channel had at ``step + 1``."""
        rank = graph.intra[graph.n_channels - 1][step + 1]
        return self.s.gpu_by_rank(rank)

    def try_nvls(self, graph, save, g: int, ngpus: int):
        """``ncclTopoSearchTryNvls``: NVSwitch -> every GPU and back, twice the bandwidth for the head ``g``."""
        n = len(self.s.nodes[GPU])
        d0 = 0
        ok = True
        while True:
            ok = self.follow_path(graph, NVS, 0, GPU, d0, 2 if d0 == g else 1) is not None
            d0 += 1
            if not ok or d0 >= n:
                break
        if not ok:
            d0 -= 1
        else:
            d1 = 0
            while True:
                ok = self.follow_path(graph, GPU, d1, NVS, 0, 2 if d1 == g else 1) is not None
                d1 += 1
                if not ok or d1 >= n:
                    break
            if not ok:
                d1 -= 1
            else:
                yield self.rec_gpu(graph, save, None, ngpus, -1, -1, 0)
            while d1:
                d1 -= 1
                self.follow_path(graph, GPU, d1, NVS, 0, -2 if d1 == g else -1)
        while d0:
            d0 -= 1
            self.follow_path(graph, NVS, 0, GPU, d0, -2 if d0 == g else -1)

    def compare(self, graph: Graph, ref: Graph) -> bool:
        """``ncclTopoCompareGraphs``: more channels x bandwidth wins, then fewer hops."""
        if graph.n_channels < graph.min_channels:
            return False
        if graph.pattern == NVLS:
            return (graph.n_channels > ref.n_channels and graph.n_channels <= len(self.s.nodes[GPU])) or \
                f32(graph.n_channels * graph.bw_inter) > f32(ref.n_channels * ref.bw_inter)
        a, b = f32(graph.n_channels * graph.bw_intra), f32(ref.n_channels * ref.bw_intra)
        if a > b:
            return True
        if a < b:
            return False
        return graph.pattern == ref.pattern and graph.cross_nic == ref.cross_nic and graph.n_hops < ref.n_hops

    def rec_gpu(self, graph, save, gpu, step, back_net, back_first, forced):
        """``ncclTopoSearchRecGpu``: place ``gpu`` at ``step`` of the current channel and go on."""
        if self.time <= 0:
            return
        self.time -= 1
        ngpus = len(self.s.nodes[GPU])
        if step == ngpus:
            graph.n_channels += 1
            if self.compare(graph, save):
                save.__dict__.update(graph.copy().__dict__)
                if graph.n_channels == graph.max_channels:
                    self.time = -1
            if graph.n_channels < graph.max_channels:
                yield self.rec(graph, save)
            graph.n_channels -= 1
            return
        row = graph.intra[graph.n_channels]
        while len(row) < ngpus:
            row.append(-1)
        row[step] = gpu.rank
        g = self.s.nodes[GPU].index(gpu)
        if step == back_net:
            if self.s.inter:
                yield self.back_to_net(graph, save, gpu, g, step, back_first, forced)
        elif graph.pattern == NVLS:
            yield self.try_nvls(graph, save, g, ngpus)
        elif step < ngpus - 1:
            if forced == FORCED_ORDER_PCI:
                nxt = [step + 1]
            elif forced == FORCED_ORDER_REPLAY:
                nxt = [self.replay_gpu(graph, step)]
            else:
                nxt = self.next_gpu_sort(graph, gpu, 0 if back_net == -1 else 1 if back_net == step + 1 else -1)
            for n in nxt:
                yield self.try_gpu(graph, save, step + 1, back_net, back_first, forced, GPU, g, n)
        elif step == back_first:
            p = self.s.gpu_by_rank(graph.intra[graph.n_channels][0])
            first = self.follow_path(graph, GPU, g, GPU, p, 1)
            if first is not None:
                yield self.rec_gpu(graph, save, first, step + 1, back_net, -1, forced)
                self.follow_path(graph, GPU, g, GPU, p, -1)
        else:
            yield self.rec_gpu(graph, save, gpu, ngpus, -1, -1, forced)

    def back_to_net(self, graph, save, gpu, g, step, back_first, forced):
        """The ``step == backToNet`` branch of ``ncclTopoSearchRecGpu``: leave the node through every NIC the
        channel may end at (a balanced tree counts half the bandwidth on each of its first two GPUs)."""
        start = self.s.nodes[NET][self.net_index(graph.inter[graph.n_channels][0])]
        for n in self.select_nets(graph.type_inter, g):
            if not check_net(graph, start, self.s.nodes[NET][n], step):
                continue
            next_back = -1
            bw_save = graph.bw_inter
            if graph.pattern == BALANCED_TREE:
                if step == 0:
                    next_back = 1
                graph.bw_inter = f32(graph.bw_inter / 2)
            net = self.follow_path(graph, GPU, g, NET, n, 1)
            graph.bw_inter = bw_save
            if net is not None:
                graph.inter[graph.n_channels][1] = net.id
                yield self.rec_gpu(graph, save, gpu, step, next_back, back_first, forced)
                if graph.pattern == BALANCED_TREE:
                    graph.bw_inter = f32(graph.bw_inter / 2)
                self.follow_path(graph, GPU, g, NET, n, -1)
                graph.bw_inter = bw_save

    def _take_net_bw(self, net, bw: int) -> None:
        """Every NET on the same NIC port (asic and port) loses (bw > 0) or gets back ``bw``."""
        for other in self.s.nodes[NET]:
            if other.asic == net.asic and other.port == net.port:
                other.bw = f32(other.bw - bw)

    def rec_net(self, graph: Graph, save: Graph, back_net: int, back_first: int):
        """``ncclTopoSearchRecNet``: start the channel at each candidate NIC in turn (rotated by the channel
        number), replay the previous channel's first GPU, or try PCI order once (no NVSwitch), then the NIC's
        local GPU, then its other closest GPUs."""
        bw = int(graph.bw_inter)          # NCCL keeps it in an int
        nets = self.select_nets(graph.type_inter, -1)
        found = False
        c = graph.n_channels
        for i in range(len(nets)):
            if graph.pattern in (NVLS, COLLNET_DIRECT) and found:
                break
            n = nets[(c + i) % len(nets)]
            net = self.s.nodes[NET][n]
            if graph.coll_net and net.coll == 0:
                continue
            if net.bw < bw:
                continue
            if graph.pattern == RING and graph.cross_nic == 2 and c & 1 and net.id != graph.inter[c - 1][1]:
                continue
            graph.inter[c][0] = net.id
            graph.latency_inter = net.latency
            self._take_net_bw(net, bw)
            if graph.pattern in (NVLS, COLLNET_DIRECT):
                # heads only: each NIC's local GPU, once
                if c < len(nets) and net.local_gpu != -1:
                    rank = self.s.nodes[GPU][net.local_gpu].rank
                    if not any(graph.intra[gc][:1] == [rank] for gc in range(c)):
                        yield self.try_gpu(graph, save, 0, back_net, back_first, 0, NET, n, net.local_gpu)
                        found = True
            elif c > 0 and graph.same_channels == 1:
                yield self.try_gpu(graph, save, 0, back_net, back_first, FORCED_ORDER_REPLAY, NET, n,
                                   self.replay_gpu(graph, -1))
            else:
                if c == 0 and not self.s.nodes[NVS]:
                    # PCI order first as a reference, on its own small budget (NCCL's local ``t``)
                    outer, self.time = self.time, 1 << 10
                    yield self.try_gpu(graph, save, 0, back_net, back_first, FORCED_ORDER_PCI, NET, n, 0)
                    t, self.time = self.time, outer
                    if t == -1:
                        self.time = -1
                local = net.local_gpu
                if local != -1:
                    yield self.try_gpu(graph, save, 0, back_net, back_first, 0, NET, n, local)
                gpus, path_type = self.get_local(NET, n, GPU)
                if path_type == PATH_DIS:
                    continue      # as NCCL: this skips giving the NIC's bandwidth back
                for g in gpus:
                    if g != local:
                        yield self.try_gpu(graph, save, 0, back_net, back_first, 0, NET, n, g)
            self._take_net_bw(net, -bw)

    def rec(self, graph: Graph, save: Graph):
        """``ncclTopoSearchRec``: across nodes from a NET (``rec_net``); on one node channel 0 tries PCI order
        first, later channels replay the previous one; then (unless sameChannels) every GPU as the first."""
        if self.s.inter:
            # ncclTopoSearchParams: back to a NET after the last GPU (ring), the second (split tree) or the first
            ngpus = len(self.s.nodes[GPU])
            back_net = ngpus - 1 if graph.pattern == RING else 1 if graph.pattern == SPLIT_TREE else 0
            yield self.rec_net(graph, save, back_net, -1)
            return
        back_first = len(self.s.nodes[GPU]) - 1 if graph.pattern == RING else -1
        if graph.pattern == NVLS:
            yield self.try_gpu(graph, save, 0, -1, back_first, 0, -1, -1, graph.n_channels)
            return
        if graph.n_channels == 0:
            yield self.try_gpu(graph, save, 0, -1, back_first, FORCED_ORDER_PCI, -1, -1, 0)
        else:
            g = self.replay_gpu(graph, -1)
            yield self.try_gpu(graph, save, 0, -1, back_first, FORCED_ORDER_REPLAY, -1, -1, g)
        if graph.same_channels == 0 or graph.n_channels == 0:
            for g in range(len(self.s.nodes[GPU])):
                yield self.try_gpu(graph, save, 0, -1, back_first, 0, -1, -1, g)


def check_net(graph: Graph, start, net, step: int) -> bool:
    """``ncclTopoSearchCheckNet``: may the channel that started at NIC ``start`` leave through ``net``?  Trees
    come back where they started; crossNic 2 rings alternate (an odd channel ends where the previous one
    started); crossNic 0 needs the same NIC port (asic and port; NCCL's rail and plane ids are not modelled); a
    balanced tree's second GPU goes to the NIC the first one chose."""
    c = graph.n_channels
    if graph.pattern == TREE and net.id != start.id:
        return False
    if graph.pattern == RING and graph.cross_nic == 2:
        if c & 1 and net.id != graph.inter[c - 1][0]:
            return False
    elif graph.cross_nic == 0 and (net.asic != start.asic or net.port != start.port):
        return False
    if graph.pattern == BALANCED_TREE and step != 0 and net.id != graph.inter[c][1]:
        return False
    return True


def dup_channels(graph: Graph, cc_min: int) -> None:
    """``ncclTopoDupChannels``: fast channels are doubled at half the bandwidth each (more blocks, same links)."""
    if graph.n_channels == 0 or graph.pattern == NVLS or graph.bw_intra < 25.0:
        return
    if cc_min > 80 and graph.bw_intra < 50.0 and graph.n_channels > 4:
        return
    dup = min(graph.n_channels * 2, graph.max_channels)
    for c in range(graph.n_channels, dup):
        graph.intra[c] = list(graph.intra[c - graph.n_channels])
        graph.inter[c] = list(graph.inter[c - graph.n_channels])
    div = div_up(dup, graph.n_channels)
    graph.bw_intra = f32(graph.bw_intra / div)
    graph.bw_inter = f32(graph.bw_inter / div)
    graph.n_channels = dup


def topo_compute(system: System, graph: Graph, trace: list | None = None) -> Graph:
    """``ncclTopoCompute``: fill ``graph`` (pattern, channels, bandwidths, types) for one node.  ``trace`` collects
    one line per search attempt (NCCL's compiled-out debug printf in ncclTopoCompute, with type names)."""
    gpus = system.nodes[GPU]
    cc_min = min(g.sm for g in gpus)
    ngpus, ndevs = len(gpus), len(system.nodes[DEV])
    cross_env = int(os.environ.get("NCCL_CROSS_NIC", "2") or 2)
    cross_nic = cross_env if len(system.nodes[NET]) > 1 and graph.pattern in (RING, BALANCED_TREE, SPLIT_TREE) \
        else 0
    graph.cross_nic = 1 if cross_nic == 1 else 0
    graph.bw_intra = graph.bw_inter = 0.0
    graph.latency_inter = 0.0
    min_intra, max_intra = (gpu_min_max_path(system, GPU) if ngpus > 1 else (PATH_LOC, PATH_SYS))
    min_inter, max_inter = PATH_PIX, PATH_SYS
    if system.inter:
        min_inter, max_inter = gpu_min_max_path(system, NET)
        max_intra = max_inter
    if cc_min < 90:      # Ampere's balanced trees sometimes come back through PHB or SYS
        max_inter = PATH_SYS
    graph.type_intra, graph.type_inter = min_intra, min_inter
    graph.n_channels = 0
    try_same = 0 if graph.pattern == NVLS else 1
    graph.same_channels = try_same
    cpu = system.nodes[CPU][0]
    if graph.pattern == NVLS and (not system.nodes[NVS] or cc_min < 90):
        return graph
    if graph.pattern == NVLS:
        graph.max_channels = min(NCCL_MAX_NVLS_ARITY, ngpus)
        graph.min_channels = graph.max_channels
    if ngpus == 1 and graph.pattern != RING:
        graph.pattern = TREE
    if graph.pattern == RING and split_nvlink(system) and graph.max_channels >= 2 and graph.min_channels == 1:
        graph.min_channels = 2

    tmp = graph.copy()
    speeds = speed_array(cc_min, system.inter)
    search = Search(system)
    max_bw, total_bw = system.max_bw, system.total_bw
    if ndevs > 1 and graph.pattern != RING:
        total_bw = f32(total_bw * (ndevs * 1.0 / (ndevs - 1)))
    si = 0
    while (speeds[si] > max_bw or speeds[si] * graph.min_channels > total_bw) and si < len(speeds) - 1:
        si += 1
    tmp.bw_intra = tmp.bw_inter = speeds[si]
    global_timeout = GLOBAL_TIMEOUT
    pass_ = 1

    def step(why: str) -> None:    # what ncclTopoCompute does next, and why (ours, with --explain)
        if trace is not None:
            trace.append(f"  -> {why}")
    step(f"Id {graph.id} Pattern {graph.pattern} ({PATTERN_NAMES.get(graph.pattern)}): speeds "
         f"{'speedArrayInter' if system.inter else 'speedArrayIntra'} for sm {cc_min} "
         f"({' '.join(f'{x:g}' for x in speeds)}), starting at {speeds[si]:g} (the first <= maxBw {max_bw:g} whose "
         f"{graph.min_channels} channel(s) fit totalBw {total_bw:g}); crossNic {tmp.cross_nic} first "
         f"(NCCL_CROSS_NIC={cross_env}{'' if len(system.nodes[NET]) > 1 else ', one NIC: 0'})")
    best = None
    while True:
        # search:
        search.time = (TIMEOUT_SAMECHANNELS if tmp.same_channels else TIMEOUT_TREE if tmp.pattern == TREE
                       else TIMEOUT)
        tmp.n_channels = 0
        global_timeout -= search.time
        search.run(search.rec(tmp, graph))
        time = search.time
        if trace is not None:
            trace.append(f"Id {tmp.id} Pattern {tmp.pattern}, crossNic {tmp.cross_nic}, Bw {tmp.bw_inter:g}/"
                         f"{tmp.bw_intra:g}, type {PATH_TYPES[tmp.type_inter]}/{PATH_TYPES[tmp.type_intra]}, "
                         f"channels {tmp.min_channels}-{tmp.max_channels} sameChannels {tmp.same_channels} -> "
                         f"nChannels {graph.n_channels}x{graph.bw_inter:g}/{graph.bw_intra:g} "
                         f"{'TIMEOUT' if time == 0 else 'PERFECT' if time == -1 else ''}".rstrip())
        found = (graph.n_channels, graph.bw_intra, graph.bw_inter, graph.cross_nic, graph.type_intra,
                 graph.type_inter, graph.pattern)
        if found != best and graph.n_channels:
            best = found
            step(f"best so far: {graph.n_channels} x {graph.bw_intra:g}/{graph.bw_inter:g} GB/s (intra/inter), "
                 f"pattern {graph.pattern}, crossNic {graph.cross_nic}, type {PATH_TYPES[graph.type_intra]}/"
                 f"{PATH_TYPES[graph.type_inter]}")
        goto_done = time == -1 or f32(graph.n_channels * graph.bw_inter) >= system.total_bw
        if goto_done and pass_ == 1:
            step("done: every channel found within the budget (PERFECT)" if time == -1 else
                 f"done: {graph.n_channels} x {graph.bw_inter:g} reaches totalBw {system.total_bw:g}")
        if not goto_done and pass_ == 1:
            if tmp.same_channels == 1 and not (cpu.arch == ARCH_X86 and cpu.vendor == VENDOR_AMD
                                               and tmp.type_intra == PATH_SYS):
                tmp.same_channels = 0
                step("sameChannels 0: let the channels differ")
                continue
            tmp.same_channels = try_same
            global_timeout = global_timeout + time if time != -1 else GLOBAL_TIMEOUT
            if global_timeout < 0 and graph.n_channels:
                goto_done = True
                step("done: the global step budget is spent and channels were found")
            else:
                if cc_min >= 90 and tmp.pattern == BALANCED_TREE:
                    tmp.pattern = TREE
                    step(f"pattern {TREE} (TREE): on sm {cc_min} >= 90 a BALANCED_TREE attempt is retried as TREE")
                    continue
                tmp.pattern = graph.pattern
                top_intra = tmp.type_inter if system.inter else max_intra
                if tmp.type_intra < top_intra and (graph.n_channels == 0 or tmp.type_intra < graph.type_intra):
                    tmp.type_intra += 1
                    if tmp.type_intra < PATH_DIS:
                        step(f"typeIntra {PATH_TYPES[tmp.type_intra - 1]} -> {PATH_TYPES[tmp.type_intra]}: allow "
                             f"worse GPU-to-GPU paths")
                        continue
                tmp.type_intra = min_intra
                if system.inter and tmp.type_inter < max_inter and (
                        graph.n_channels == 0 or tmp.type_inter < graph.type_inter or tmp.type_inter < PATH_PXN):
                    tmp.type_inter += 1
                    if tmp.type_inter < PATH_DIS:
                        step(f"typeInter {PATH_TYPES[tmp.type_inter - 1]} -> {PATH_TYPES[tmp.type_inter]}: allow "
                             f"worse GPU-to-NIC paths" + (" (PXN: through an NVLink peer's NIC)"
                                                          if tmp.type_inter == PATH_PXN else ""))
                        continue
                tmp.type_inter = min_inter
                if cross_nic == 2 and tmp.cross_nic == 0 and graph.pattern in (RING, BALANCED_TREE):
                    tmp.cross_nic = 2
                    step("crossNic 2: NCCL_CROSS_NIC=2 lets a channel leave by another NIC than it came in by")
                    continue
                tmp.cross_nic = 1 if cross_nic == 1 else 0
                if si < len(speeds) - 1 and (graph.n_channels == 0 or f32(speeds[si + 1] / graph.bw_inter) > .49):
                    si += 1
                    tmp.bw_inter = tmp.bw_intra = speeds[si]
                    step(f"speed {speeds[si - 1]:g} -> {speeds[si]:g} GB/s, types and crossNic reset")
                    continue
                step("done: every relaxation tried down to the slowest useful speed")
                si = 0
                while speeds[si] > max_bw and si < len(speeds) - 1:
                    si += 1
                tmp.bw_intra = tmp.bw_inter = speeds[si]
        # done:
        if pass_ == 1:
            time = -1
            before = (graph.n_channels, graph.bw_intra)
            dup_channels(graph, cc_min)
            if trace is not None and before != (graph.n_channels, graph.bw_intra):
                trace.append(f"Dup: {before[0]} x {before[1]:g} -> {graph.n_channels} x {graph.bw_intra:g}")
            best = (graph.n_channels, graph.bw_intra, graph.bw_inter, graph.cross_nic, graph.type_intra,
                    graph.type_inter, graph.pattern)
            tmp = graph.copy()
            si = 0
            while speeds[si] > graph.bw_inter and si < len(speeds) - 1:
                si += 1
            tmp.bw_intra = tmp.bw_inter = speeds[si]
            tmp.min_channels = graph.n_channels
            pass_ = 2
            step(f"pass 2: try faster speeds again with at least {graph.n_channels} channels")
        if pass_ == 2:
            if time != 0 and si > 0:
                if graph.pattern == RING:
                    si -= 1
                    tmp.bw_intra = tmp.bw_inter = speeds[si]
                    step(f"pass 2: speed {speeds[si]:g} GB/s")
                    continue
                if graph.pattern == NVLS and tmp.bw_inter == graph.bw_inter and tmp.bw_inter < tmp.bw_intra * 2:
                    tmp.min_channels = tmp.max_channels = graph.n_channels
                    si -= 1
                    tmp.bw_inter = speeds[si]
                    continue
                if tmp.bw_intra == graph.bw_intra and tmp.bw_intra < tmp.bw_inter * 2:
                    si -= 1
                    tmp.bw_intra = speeds[si]
                    step(f"pass 2: intra speed {speeds[si]:g} GB/s")
                    continue
        break
    if graph.n_channels:
        why = {0: "every attempt that found the best graph kept each channel on one NIC (or there is one NIC)",
               1: "NCCL_CROSS_NIC=1 marks every graph crossNic 1",
               2: "the best graph was first found once crossNic 2 was allowed: no attempt with crossNic 0 "
                  "reached it"}.get(graph.cross_nic, "")
        step(f"result: {graph.n_channels} x {graph.bw_intra:g}/{graph.bw_inter:g} GB/s, pattern {graph.pattern}, "
             f"crossNic {graph.cross_nic}: {why}")
    if graph.n_channels == 0 and graph.coll_net == 0 and graph.pattern != NVLS:
        # "Could not find a path for pattern %d, falling back to simple order": PCI order, 0.1 GB/s
        graph.fallback = True
        graph.intra[0] = [g.rank for g in gpus]
        graph.bw_intra = f32(0.1)
        graph.type_intra = PATH_SYS
        if system.nodes[NET]:   # ncclTopoSelectNets(typeInter -1, first / last GPU): their first local NIC
            first = system.nodes[NET][select_nets(system, -1, 0)[0]].id
            last = system.nodes[NET][select_nets(system, -1, ngpus - 1)[0]].id
            graph.inter[0] = [first, last]
            graph.bw_inter, graph.type_inter = f32(0.1), PATH_SYS
        else:
            graph.inter[0] = [-1, -1]
            graph.bw_inter, graph.type_inter = 0.0, PATH_DIS
        graph.n_channels = 1
    return graph


def split_nvlink(system: System) -> bool:
    """``ncclTopoSplitNvLink``: exactly two NVLink islands (e.g. two 4-GPU boards)."""
    gpus = system.nodes[GPU]
    domain = list(range(len(gpus)))
    for g, gpu in enumerate(gpus):
        for p in range(g + 1, len(gpus)):
            if gpu.paths[GPU][p].type == 1:
                domain[p] = domain[g]
    counts = [domain.count(g) for g in range(len(gpus))]
    return sum(1 for c in counts if c > 1) == 2


def net_name(net_id: int) -> str:
    """``NET/<system id>-<local id>`` of a NET topology id (also for -1, printed as NCCL's %lx does)."""
    net_id &= (1 << 64) - 1
    return f"NET/{net_id >> 56:x}-{net_id & 0x00ffffffffffffff:x}"


def print_graph(system: System, graph: Graph) -> list[str]:
    """``ncclTopoPrintGraph``: the Pattern line, then one line of GPU ids per channel."""
    out = [f"Pattern {graph.pattern}, crossNic {graph.cross_nic}, nChannels {graph.n_channels}, "
           f"bw {graph.bw_intra:f}/{graph.bw_inter:f}, type {PATH_TYPES[graph.type_intra]}/"
           f"{PATH_TYPES[graph.type_inter]}, sameChannels {graph.same_channels}"]
    gpus = system.nodes[GPU]
    for c in range(graph.n_channels):
        line = f"{c:2d} :"
        if system.inter:
            line += " " + net_name(graph.inter[c][0])
        for i, rank in enumerate(graph.intra[c][:len(gpus)]):
            line += " " + gpus[system.gpu_by_rank(rank)].name()
            if graph.id == 3:
                break
        if system.inter:
            line += " " + net_name(graph.inter[c][1])
        out.append(line)
    return out

