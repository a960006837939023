"""Devices, contexts and protection domains (pyverbs ``pyverbs.device``, ``pyverbs.pd``) of the software verbs
provider: a stand-in for an HCA, not one.

One device, ``sim_ib0``, port 1, link layer InfiniBand; on an emulated node whose topology has NICs, one device per
NIC instead (``emulate_nics``: ``mlx5_0`` ... as the XML names them), each its own HCA.  A device's LID is the TCP
port its wire thread listens on at 127.0.0.1: the stand-in's subnet is one host, which is where the lab's emulated
nodes (``NCCL_HOSTID``) live.
"""
from __future__ import annotations

from types import SimpleNamespace

from . import enums as e
from .error import SimVerbsError

DEVICE_NAMES = ["sim_ib0"]


def device_names() -> list[str]:
    return list(DEVICE_NAMES)


def emulate_nics(names: list[str]) -> None:
    """The process's emulated node has these NICs (its topology's, in net-device order): from now on they are the
    provider's devices.  An empty list keeps ``sim_ib0``."""
    if names:
        DEVICE_NAMES[:] = names


class Context:
    def __init__(self, name: str | None = None, **_kw):
        if name not in DEVICE_NAMES:
            raise SimVerbsError(f"device {name} not found")
        from .hca import get_hca  # the wire thread starts with the first context
        self.name, self.hca = name, get_hca(name)

    def query_device(self) -> SimpleNamespace:
        return SimpleNamespace(phys_port_cnt=1, max_qp_wr=32768, max_sge=30, max_cqe=4194303, max_qp=1 << 17,
                               max_mr_size=1 << 48, fw_ver="stand-in", vendor_id=0, vendor_part_id=0)

    def query_port(self, port_num: int) -> SimpleNamespace:
        if port_num != 1:
            raise SimVerbsError(f"{self.name} has no port {port_num}")
        return SimpleNamespace(state=e.IBV_PORT_ACTIVE, lid=self.hca.lid, active_mtu=e.IBV_MTU_4096,
                               max_mtu=e.IBV_MTU_4096, link_layer=e.IBV_LINK_LAYER_INFINIBAND, active_speed=0,
                               active_width=0, gid_tbl_len=1, max_msg_sz=1 << 31, port_cap_flags=0)

    def query_gid(self, port_num: int, index: int):
        from .addr import GID
        if index != 0:
            raise SimVerbsError(f"{self.name} port {port_num} has no GID index {index}")
        return GID.from_ipv4(self.hca.ip)

    def close(self) -> None:
        pass


class PD:
    def __init__(self, creator: Context, **_kw):
        self.ctx, self.hca = creator, creator.hca

    def close(self) -> None:
        pass
