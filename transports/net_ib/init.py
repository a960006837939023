"""Device discovery (NCCL ``src/transport/net_ib/init.cc``: ``ncclIbInitDevices``; ``src/misc/utils.cc``:
``parseStringList``, ``matchIfList``).

``NCCL_IB_HCA``: a comma list of ``name[:port]``; a leading ``^`` excludes the listed devices instead, a ``=``
after it makes names exact (otherwise a name is a prefix: ``mlx5`` matches ``mlx5_0``); no port means any port.
Each active port of each selected device is one net device.  Adaptive routing defaults to on for InfiniBand
links (``NCCL_IB_ADAPTIVE_ROUTING`` overrides).  The line ``NET/IB : Using [0]mlx5_0:1/IB ; OOB eth0:<addr>``
lists them.  We merge no NICs (no virtual devices of several ports).
"""
from __future__ import annotations

from dataclasses import dataclass

from collectives.misc import sockets
from tracing import debug

from .params import IbParams


def parse_hca(spec: str) -> tuple[bool, bool, list[tuple[str, int]]]:
    """-> (exclude, exact, [(name, port or -1)])"""
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    out = []
    for entry in spec.split(","):
        name, _, rest = entry.partition(":")
        if name:
            port = rest.split(":")[0]
            out.append((name, int(port) if port else -1))
    return exclude, exact, out


def hca_selected(name: str, port: int, spec: str) -> bool:
    if not spec:
        return True
    exclude, exact, items = parse_hca(spec)
    hit = any((name == n if exact else name.startswith(n)) and (p == -1 or p == port) for n, p in items)
    return hit != exclude


@dataclass
class IbDev:
    """``struct ncclIbDev``: one port of one HCA, opened."""
    index: int
    name: str
    port: int
    link_layer: int
    lid: int
    gid: object
    gid_index: int
    mtu: int
    ar: int
    context: object
    pd: object

    def link_str(self, e) -> str:
        return "IB" if self.link_layer == e.IBV_LINK_LAYER_INFINIBAND else "RoCE"


def _gid_index(V, ctx, port: int, attr, params: IbParams) -> int:
    """NCCL_IB_GID_INDEX, else 0 on InfiniBand; on RoCE the first IPv4-mapped (RoCEv2-style) GID.  NCCL's own
    pick (``ncclIbGetGidIndex``) also weighs the RoCE version and address family; we keep the simple rule."""
    if params.gid_index >= 0 or attr.link_layer == V.e.IBV_LINK_LAYER_INFINIBAND:
        return max(params.gid_index, 0)
    for i in range(getattr(attr, "gid_tbl_len", 1)):
        try:
            if str(ctx.query_gid(port, i)).startswith("0000:0000:0000:0000:0000:ffff:"):
                return i
        except Exception:  # noqa: BLE001  unpopulated entry
            continue
    return 0


def init_devices(V, params: IbParams) -> list[IbDev]:
    e, devs = V.e, []
    for name in V.device_names:
        ctx = V.Context(name=name)
        nports = ctx.query_device().phys_port_cnt
        pd = None
        for port in range(1, nports + 1):
            attr = ctx.query_port(port)
            if attr.state != e.IBV_PORT_ACTIVE or not hca_selected(name, port, params.hca):
                continue
            if attr.link_layer not in (e.IBV_LINK_LAYER_INFINIBAND, e.IBV_LINK_LAYER_ETHERNET):
                continue
            pd = pd or V.PD(ctx)
            gidx = _gid_index(V, ctx, port, attr, params)
            ar = 1 if attr.link_layer == e.IBV_LINK_LAYER_INFINIBAND else 0
            if params.adaptive_routing != -2:
                ar = params.adaptive_routing
            dev = IbDev(len(devs), name, port, attr.link_layer, attr.lid, ctx.query_gid(port, gidx), gidx,
                        attr.active_mtu, ar, ctx, pd)
            devs.append(dev)
            debug.info("NET", f"NET/IB: [{dev.index}] {name}:{name}:{port}/{dev.link_str(e)} provider={V.name} "
                              f"ar={ar}")
    return devs


def log_using(V, devs: list[IbDev]) -> tuple[str, str]:
    ifname, addr = sockets.find_interface()
    line = "".join(f" [{d.index}]{d.name}:{d.port}/{d.link_str(V.e)}" for d in devs)
    debug.info("INIT", f"NET/IB : Using{line} ; OOB {ifname}:{addr}<0>")
    return ifname, addr
