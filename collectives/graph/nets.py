"""Which NICs a channel may start from and come back to (NCCL ``src/graph/search.cc``: ``ncclTopoSelectNets``,
``ncclTopoPrefNetsChannelFirst``, ``gpuPciBw``, ``getNetIndex``, and ``ncclTopoGetNetDev`` for a collective's
graph; ``ncclTopoSearchCheckNet`` is in search.py).

``select_nets`` lists first each GPU's preferred NICs (``ncclTopoGetLocalNet`` channel after channel, until the
first one repeats), then every other NIC whose path from the GPU(s) is of type <= typeInter, best type first.
Differences on purpose: only NCCL_NETDEVS_POLICY=AUTO (every NIC allowed) and one host per system (no MNNVL, so
the GPU-first order and the per-host rails do not apply); NICs have no rail or plane ids (the XML gives none).
"""
from __future__ import annotations

from collectives.include.device import MAXCHANNELS

from .paths import intermediate_rank, local_net
from .topo import GPU, LINK_PCI, NET, Node, System


def pref_nets_channel_first(system: System, gpu: int, nets: list[int]) -> None:
    """``ncclTopoPrefNetsChannelFirst``: for each GPU (or only ``gpu``), its local NIC of channel 0, 1, ... until
    the channel-0 NIC comes round again; appended to ``nets`` without repeats."""
    for g, node in enumerate(system.nodes[GPU]):
        if gpu != -1 and gpu != g:
            continue
        local: list[int] = []
        for c in range(MAXCHANNELS):
            n = local_net(system, node.rank, c)
            if local and n == local[0]:
                break
            local.append(n)
        for n in local:
            if n not in nets:
                nets.append(n)


def select_nets(system: System, type_inter: int, gpu: int) -> list[int]:
    """``ncclTopoSelectNets``: NET indices to try, for every GPU (``gpu == -1``, a channel's start) or one GPU
    (coming back to a NIC)."""
    nets: list[int] = []
    pref_nets_channel_first(system, gpu, nets)
    # NETDEVS_POLICY AUTO: no cap, so add every other NIC reachable within typeInter, by path type
    for t in range(type_inter + 1):
        for g, node in enumerate(system.nodes[GPU]):
            if gpu != -1 and gpu != g:
                continue
            paths = node.paths[NET]
            for n in range(min(len(system.nodes[NET]), MAXCHANNELS)):
                if paths[n].type == t and n not in nets:
                    nets.append(n)
    return nets


def gpu_pci_links(gpu: Node) -> tuple:
    """The two directions of the GPU's PCI link that ``gpuPciBw`` reads (the first PCI link with a way back), or
    () when it has none."""
    dev = gpu.parent
    return next(((link, back) for link in dev.links if link.type == LINK_PCI
                 for back in link.rem.links if back.rem is dev), ())


def gpu_pci_bw(links: tuple) -> int:
    """``gpuPciBw``: the narrower direction of the GPU's PCI link, as NCCL's int, from ``gpu_pci_links`` (the
    bandwidth the search left on them); -1 without one."""
    return int(min(links[0].bw, links[1].bw)) if links else -1


def net_index(system: System, net_id: int) -> int:
    """``getNetIndex``: the NET node with topology id ``net_id``."""
    for n, net in enumerate(system.nodes[NET]):
        if net.id == net_id:
            return n
    raise ValueError(f"no NET with id {net_id:x}")


def net_dev(system: System, graph, n_channels: int, rank: int, channel: int) -> tuple[int, int, int]:
    """``ncclTopoGetNetDev`` with a graph (ring and tree connections): channel ``channel % n_channels`` of this
    rank's own graph; the channel's first GPU uses the NIC the channel starts from (``inter[c][0]``), any other
    GPU the one it ends at (``inter[c][1]``).  Returns (NET index, the NIC's net device, the proxy rank: the
    NVLink peer a PXN path relays through, else ``rank``)."""
    c = channel % n_channels
    end = 0 if graph.intra[c][0] == rank else 1
    n = net_index(system, graph.inter[c][end])
    return n, system.nodes[NET][n].dev, intermediate_rank(system, rank, n)


def nic_names(system: System) -> list[str]:
    """The node's net devices as a net plugin lists them (ours: NCCL asks the plugin, the lab's stand-in provider
    asks the topology): index d is the NET of dev d, named as its ``<net name=...>``, else ``mlx5_<d>``."""
    nets = {n.dev: n.net_name for n in system.nodes[NET]}
    return [nets.get(d) or f"mlx5_{d}" for d in range(max(nets, default=-1) + 1)]
