"""Paths between every pair of GPUs, NICs, CPUs and NVSwitches (NCCL ``src/graph/paths.cc``: ``ncclTopoSetPaths``,
``ncclTopoComputePaths``, ``ncclTopoCheckP2p``, ``ncclTopoCheckGdr``, ``ncclTopoCheckNet``, ``ncclGetLevel``, ``ncclTopoGetIntermediateRank``, ``addInterStep``, ``ncclTopoTrimSystem``,
``ncclTopoPrintPaths``; ``ncclTopoGetLocal``, ``ncclTopoGetLocalNet``, ``ncclTopoGetLocalGpu`` of ``topo.cc``;
``ncclTopoSearchInit`` of ``search.cc``).

A path's type is the worst hop: LOC < NVL < NVB (one GPU relaying over NVLink) < C2C < PIX (one PCI switch) <
PXB (several) < P2C < PXN (through a peer GPU to its NIC) < PHB (through the CPU) < SYS (between CPUs).  Its
bandwidth is the narrowest link.  Differences from NCCL on purpose: NVML's P2P status is taken as OK (a CPU
cannot ask the driver), and every rank is on this host, so no path becomes PATH_NET.
"""
from __future__ import annotations

import os

from collectives.include.bitops import div_up
from collectives.include.device import MAXCHANNELS
from collectives.misc.param import env_int

from .topo import (CPU, DEV, GPU, LINK_LOC, LINK_NET, LINK_NVL, LINK_PCI, LOC_BW, NET, NODE_TYPES, NVS, PATH_C2C,
                   PATH_DIS, PATH_LOC, PATH_NET, PATH_NVB, PATH_NVL, PATH_P2C, PATH_PHB, PATH_PIX, PATH_PXB, PATH_PXN,
                   PATH_SYS, PATH_TYPES, PCI, ARCH_X86, VENDOR_AMD, Node, Path, System, f32)
from .topo_xml import TopoError


def _ensure(node: Node, t: int, system: System) -> list[Path]:
    if t not in node.paths:
        node.paths[t] = [Path() for _ in system.nodes[t]]
    return node.paths[t]


def set_paths(base: Node, system: System) -> None:
    """``ncclTopoSetPaths``: breadth-first from ``base``, keeping for every node the best path towards ``base``
    (lower type, then higher bandwidth, then fewer hops).  A DEV (a GPU's PCI function) is crossed only into its
    own GPU, or over NVLink to another DEV within the NVB hop limit (GPU relays)."""
    t = base.type
    bi = system.index(base)
    _ensure(base, t, system)
    bp = base.paths[t][bi]
    bp.links, bp.bw, bp.type = [], LOC_BW, PATH_LOC
    nvb_disable = os.environ.get("NCCL_NVB_DISABLE", "0") == "1"
    max_len = 2 if t == GPU else 1
    base_dev = base.parent if t == GPU else base
    frontier = [base]
    while frontier:
        nxt: list[Node] = []
        for node in frontier:
            path = node.paths[t][bi]
            for link in node.links:
                rem = link.rem
                rem_path = _ensure(rem, t, system)[bi]
                bw = min(path.bw, link.bw)
                if node is not base_dev and node.type == DEV and (link.type != LINK_LOC or rem.type != GPU) and (
                        nvb_disable or link.type != LINK_NVL or rem.type != DEV or path.count > max_len):
                    continue
                new = LINK_LOC if link.type == LINK_NET else link.type
                if node.type == PCI and rem.type == PCI:
                    new = PATH_PXB
                if link.type == LINK_PCI and (node.type == CPU or rem.type == CPU):
                    new = PATH_PHB
                if node.type == DEV and path.type == PATH_NVL and new == PATH_NVL and path.count == max_len:
                    new = PATH_NVB
                new = max(path.type, new)
                if new < rem_path.type or (new == rem_path.type and rem_path.bw < bw) or (
                        new == rem_path.type and rem_path.bw == bw and rem_path.count > path.count + 1):
                    rev = next((lk for lk in rem.links if lk.rem is node and lk.type == link.type), None)
                    if rev is None:   # NCCL: "Failed to find reverse path" (a one-way NVLink, as a bad target makes)
                        raise TopoError(f"no reverse link from {rem.name()} to {node.name()}: a one-way link (an "
                                        f"<nvlink> whose target is not the GPU that links back?); NCCL fails with "
                                        f"'Failed to find reverse path'")
                    rem_path.links = [rev] + path.links
                    rem_path.bw = bw
                    rem_path.type = new
                    if rem not in nxt:
                        nxt.append(rem)
        frontier = nxt


def get_local(system: System, t: int, index: int, result_t: int) -> tuple[list[int], int]:
    """``ncclTopoGetLocal``: the nodes of ``result_t`` with the best (bandwidth, then type) path, and that type."""
    paths = system.nodes[t][index].paths.get(result_t)
    if paths is None:
        return [], PATH_DIS
    min_type, max_bw, out = PATH_DIS, 0.0, []
    for i, p in enumerate(paths):
        if p.bw > max_bw or (p.bw == max_bw and p.type < min_type):
            max_bw, min_type, out = p.bw, p.type, []
        if p.bw == max_bw and p.type == min_type:
            out.append(i)
    return out, min_type


def local_cpu(system: System, g: int) -> int:
    """``ncclGetLocalCpu``: the closest CPU, fewest hops among equals."""
    cpus, _ = get_local(system, GPU, g, CPU)
    if not cpus:
        return -1
    paths = system.nodes[GPU][g].paths[CPU]
    best = cpus[0]
    for c in cpus[1:]:
        if paths[c].count < paths[best].count:
            best = c
    return best


def _mirror_bits(val: int, pow2: int) -> int:
    out, b, mb = 0, 1, pow2 >> 1
    while b < pow2:
        if val & b:
            out |= mb
        b, mb = b << 1, mb >> 1
    return out


def local_net(system: System, rank: int, channel: int) -> int:
    """``ncclTopoGetLocalNet`` (NCCL_NETDEVS_POLICY=AUTO): the NET index rank uses on ``channel``; GPUs sharing
    NICs are spread over them by bit-mirrored device index."""
    g = system.gpu_by_rank(rank)
    nets, _ = get_local(system, GPU, g, NET)
    if not nets:
        raise TopoError(f"no local path from GPU {g} to a NIC")
    gpus, _ = get_local(system, NET, nets[0], GPU)
    per_gpu = div_up(len(nets), len(gpus))
    net = system.nodes[GPU][g].dev % len(gpus)
    if len(nets) & (len(nets) - 1) == 0:
        net = _mirror_bits(net, len(nets))
    net += channel % per_gpu
    return nets[net % len(nets)]


def local_gpu(system: System, n: int) -> int:
    """``ncclTopoGetLocalGpu``: the first close GPU that picks NIC ``n`` on some channel, or -1."""
    gpus, _ = get_local(system, NET, n, GPU)
    for c in range(MAXCHANNELS):
        for g in gpus:
            if local_net(system, system.nodes[GPU][g].rank, c) == n:
                return g
    return -1


def intermediate_rank(system: System, rank: int, n: int) -> int:
    """``ncclTopoGetIntermediateRank``: the GPU a PXN path to NIC ``n`` relays through."""
    g = system.gpu_by_rank(rank)
    path = system.nodes[GPU][g].paths[NET][n]
    if path.type != PATH_PXN:
        return rank
    i = 1
    while i < path.count and path.links[i].rem.type == NVS:
        i += 1
    node = path.links[i].rem
    if node.type == DEV:
        node = next(lk.rem for lk in node.links if lk.rem.type == GPU)
    return node.rank


GDR_DISABLED, GDR_DEFAULT, GDR_PCI = 0, 1, 2      # enum ncclTopoGdrMode
_OLD_LEVELS = (PATH_LOC, PATH_PIX, PATH_PXB, PATH_PHB, PATH_SYS, PATH_SYS)


def user_level(disable_env: str | None, level_env: str) -> int | None:
    """``ncclGetLevel``: ``<disable_env>=1`` is LOC; ``<level_env>`` is a path type name (LOC ... SYS) or NCCL's
    old numbering 0-5; None when neither is set."""
    if disable_env and env_int(disable_env, 0) == 1:
        return PATH_LOC
    text = os.environ.get(level_env)
    if text is None:
        return None
    if text in PATH_TYPES[:PATH_SYS + 1]:
        return PATH_TYPES.index(text)
    if text[:1].isdigit():
        return _OLD_LEVELS[min(int("".join(c for c in text if c.isdigit()) or 0), len(_OLD_LEVELS) - 1)]
    return None


def gdr_mode(system: System, rank: int, n: int, read: bool) -> int:
    """``ncclTopoCheckGdr``: GPUDirect RDMA between rank's GPU and NIC ``n``: GDR_DISABLED, GDR_DEFAULT, or GDR_PCI
    (forced PCIe mapping on a C2C system).  Sends (``read``) before Ampere need an NVLink peer (or a GPU alone);
    the distance, the proxy GPU's under PXN, must be within NCCL_NET_GDR_LEVEL (P2C by default, PXB with
    NCCL_NET_GDR_C2C=0)."""
    net = system.nodes[NET][n]
    g = system.gpu_by_rank(rank)
    gpu = system.nodes[GPU][g]
    if not net.gdr or not gpu.gdr:
        return GDR_DISABLED
    if read:
        read_param = env_int("NCCL_NET_GDR_READ", -2)
        if read_param == 0:
            return GDR_DISABLED
        if read_param < 0 and gpu.sm < 80:
            nvlink = len(system.nodes[GPU]) == 1 or any(
                p.type == PATH_NVL for i, p in enumerate(gpu.paths[GPU]) if i != g)
            if not nvlink:
                return GDR_DISABLED
    level = PATH_P2C if env_int("NCCL_NET_GDR_C2C", 1) else PATH_PXB
    user = user_level(None, "NCCL_NET_GDR_LEVEL")
    if user is not None:
        level = user
    distance = gpu.paths[NET][n].type
    if distance == PATH_PXN:
        g = system.gpu_by_rank(intermediate_rank(system, rank, n))
        gpu = system.nodes[GPU][g]
        distance = gpu.paths[NET][n].type
    if distance > level:
        return GDR_DISABLED
    c = local_cpu(system, g)
    if c != -1 and gpu.paths[CPU][c].type == PATH_C2C and distance != PATH_P2C:
        return GDR_PCI
    return GDR_DEFAULT


def check_gdr(system: System, rank: int, n: int, read: bool) -> bool:
    """``ncclTopoCheckGdr`` as a yes/no (any mode but disabled)."""
    return gdr_mode(system, rank, n, read) != GDR_DISABLED


def check_p2p(system: System, rank1: int, rank2: int) -> tuple[bool, bool, int]:
    """``ncclTopoCheckP2p`` for two ranks of this node: (P2P within the P2P level, P2P read, intermediate rank or
    -1).  A 4-hop GPU-DEV-DEV-DEV-GPU path relays through the middle DEV's GPU (NVB); read is Ampere (sm 80) over
    direct NVLink only.  NVML's P2P status is taken as OK (as in compute_paths)."""
    g1, g2 = system.gpu_by_rank(rank1), system.gpu_by_rank(rank2)
    path = system.nodes[GPU][g1].paths[GPU][g2]
    inter = -1
    if path.count == 4 and path.links[1].rem.type == DEV:
        dev = path.links[1].rem
        inter = next(lk.rem for lk in dev.links if lk.rem.type == GPU).rank
    p2p = path.type <= p2p_level(system)
    a, b = system.nodes[GPU][g1], system.nodes[GPU][g2]
    read = path.type == PATH_NVL and a.sm == b.sm == 80
    return p2p, read, inter


def check_net(system: System, rank1: int, rank2: int) -> bool:
    """``ncclTopoCheckNet``: would the NIC beat the GPU-to-GPU path for these two local ranks?  Both GPUs need a
    NIC path of type PXB or better, faster than their path to each other (NCCL_NET_DISABLE_INTRA=1: never)."""
    if env_int("NCCL_NET_DISABLE_INTRA", 0) == 1:
        return False
    g1, g2 = system.gpu_by_rank(rank1), system.gpu_by_rank(rank2)
    gpu1, gpu2 = system.nodes[GPU][g1], system.nodes[GPU][g2]
    speed = gpu1.paths[GPU][g2].bw
    best1 = max([p.bw for p in gpu1.paths.get(NET, []) if p.type <= PATH_PXB] + [0.0])
    best2 = max([p.bw for p in gpu2.paths.get(NET, []) if p.type <= PATH_PXB] + [0.0])
    return best1 > speed and best2 > speed


def _merge_type(a: int, b: int) -> int:
    hi, lo = max(a, b), min(a, b)
    return PATH_P2C if hi == PATH_PHB and lo == PATH_C2C else hi


def add_inter_step(system: System, tx: int, ix: int, t1: int, i1: int, t2: int, i2: int) -> None:
    """``addInterStep``: route node1 -> node2 through node ``(tx, ix)`` (a CPU, or a GPU for PXN)."""
    mid = system.nodes[tx][ix]
    src = system.nodes[t1][i1]
    first, second = src.paths[tx][ix], mid.paths[t2][i2]
    out = src.paths[t2][i2]
    out.links = first.links + second.links
    out.type = PATH_PXN if tx == GPU else _merge_type(first.type, second.type)
    out.bw = min(first.bw, second.bw)


def p2p_level(system: System) -> int:
    """``ncclTopoCheckP2p``'s level: PXB, or SYS on AMD with at most two GPUs; NCCL_P2P_LEVEL/DISABLE override."""
    level = PATH_PXB
    cpu = system.nodes[CPU][0]
    if cpu.arch == ARCH_X86 and cpu.vendor == VENDOR_AMD and len(system.nodes[DEV]) <= 2:
        level = PATH_SYS
    user = user_level("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL")
    return level if user is None else user


def compute_paths(system: System) -> None:
    """``ncclTopoComputePaths``: BFS from every CPU, DEV, GPU, NET and NVS; GPU pairs without P2P go through their
    CPU; GPU->NIC paths use PXN through a peer GPU when that is better; NICs learn their local GPU."""
    for nodes in system.nodes:
        for n in nodes:
            n.paths = {}
    system.pxn_routes = []
    for t in (CPU, DEV, GPU, NET, NVS):
        for node in system.nodes[t]:
            set_paths(node, system)
    level = p2p_level(system)
    gpus = system.nodes[GPU]
    for g in range(len(gpus)):
        for p in range(len(gpus)):
            if gpus[p].paths[GPU][g].type > level:
                add_inter_step(system, CPU, local_cpu(system, g), GPU, p, GPU, g)
    for g, gpu in enumerate(gpus):
        c = local_cpu(system, g)
        if c == -1:
            continue
        nets, _ = get_local(system, GPU, g, NET)
        for n in nets:
            net = system.nodes[NET][n]
            if _merge_type(gpu.paths[CPU][c].type, net.paths[CPU][c].type) == PATH_P2C:
                gpu.paths[NET][n].type = min(PATH_P2C, gpu.paths[NET][n].type)
                net.paths[GPU][g].type = min(PATH_P2C, net.paths[GPU][g].type)
    pxn = env_int("NCCL_PXN_DISABLE", 0) != 1
    pxn_type = PATH_P2C if env_int("NCCL_PXN_C2C", 1) else PATH_PXB
    for n, net in enumerate(system.nodes[NET]):
        for g, gpu in enumerate(gpus):
            if pxn:
                peer_i = local_gpu(system, n)
                if peer_i not in (g, -1):
                    peer = gpus[peer_i]
                    if (peer.paths[NET][n].type <= pxn_type and check_gdr(system, peer.rank, n, True)
                            and peer.paths[GPU][g].type <= PATH_NVL
                            and (peer.paths[NET][n].bw > gpu.paths[NET][n].bw
                                 or gpu.paths[NET][n].type > PATH_PXN)):
                        mine = gpu.paths[NET][n]
                        why = (f"{PATH_TYPES[mine.type]} path through the CPU" if mine.type > PATH_PXN else
                               f"{mine.bw:g} GB/s {PATH_TYPES[mine.type]} path")
                        add_inter_step(system, GPU, peer_i, GPU, g, NET, n)
                        system.pxn_routes.append(
                            f"GPU rank {gpu.rank} -> NET/{net.dev}: PXN through rank {peer.rank}, the NIC's own "
                            f"GPU ({PATH_TYPES[peer.paths[NET][n].type]}, {peer.paths[NET][n].bw:g} GB/s, GDR; "
                            f"NVLink to us), instead of our {why}")
            if gpu.paths[NET][n].type < PATH_PHB and not check_gdr(system, gpu.rank, n, False):
                c = local_cpu(system, g)
                add_inter_step(system, CPU, c, NET, n, GPU, g)
                add_inter_step(system, CPU, c, GPU, g, NET, n)
    for n, net in enumerate(system.nodes[NET]):
        net.local_gpu = local_gpu(system, n)


def trim_system(system: System, rank: int, nranks: int) -> None:
    """``ncclTopoTrimSystem``: keep only the GPUs reachable from ``rank`` without the network."""
    gpus = system.nodes[GPU]
    domains = list(range(len(gpus)))
    mine = 0
    for g, gpu in enumerate(gpus):
        for p in range(g):
            if gpu.paths[GPU][p].type < PATH_NET:
                domains[g] = min(domains[g], domains[p])
        if gpu.rank == rank:
            mine = domains[g]
    for gpu in [gpu for g, gpu in enumerate(list(gpus)) if domains[g] != mine]:
        system.remove(GPU, system.index(gpu))
    system.inter = 0 if len(system.nodes[GPU]) == nranks else 1


def search_init(system: System) -> None:
    """``ncclTopoSearchInit``: maxBw (best DEV-DEV path, or DEV-NET across nodes) and totalBw (a DEV's NVLinks,
    or its PCI link if wider)."""
    system.max_bw = system.total_bw = 0.0
    if system.inter == 0 and len(system.nodes[GPU]) == 1:
        system.max_bw = system.total_bw = LOC_BW
        return
    target = NET if system.inter else DEV
    for dev in system.nodes[DEV]:
        for p in dev.paths.get(target, []):
            if p.count:
                system.max_bw = max(system.max_bw, p.bw)
        nvl = pci = 0.0
        for link in dev.links:
            if link.type == LINK_NVL:
                nvl = f32(nvl + link.bw)
            if link.type == LINK_PCI:
                pci = link.bw
        system.total_bw = max(system.total_bw, pci, nvl)


def print_paths(system: System) -> list[str]:
    """``ncclTopoPrintPaths``: one line per GPU and per NET, ``TYPE/id (hops/bw/type)`` for every target."""
    out = []
    for t in (GPU, NET):
        for node in system.nodes[t]:
            line = f"{node.name()} :"
            for tt in range(len(NODE_TYPES)):
                if tt not in node.paths:
                    continue
                for i, target in enumerate(system.nodes[tt]):
                    p = node.paths[tt][i]
                    line += f"{target.name()} ({p.count}/{p.bw:.1f}/{PATH_TYPES[p.type]}) "
            out.append(line)
    return out


def gpu_min_max_path(system: System, t: int) -> tuple[int, int]:
    """``ncclTopoGetGpuMinPath`` / ``ncclTopoGetGpuMaxPath`` over GPU -> type ``t``."""
    lo, hi = PATH_SYS, PATH_LOC
    for i, gpu in enumerate(system.nodes[GPU]):
        paths = gpu.paths.get(t)
        if paths is None:
            continue
        for j, p in enumerate(paths):
            if t == GPU and i == j:
                continue
            lo, hi = min(lo, p.type), max(hi, p.type)
    return lo, hi
