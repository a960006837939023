"""Addressing (pyverbs ``pyverbs.addr``: ``GID``, ``GlobalRoute``, ``AHAttr``) for the software verbs provider."""
from __future__ import annotations

import ipaddress


class GID:
    """A 16-byte GID written as eight 4-hex-digit words, as pyverbs takes and prints it."""

    def __init__(self, val: str = "0000:0000:0000:0000:0000:0000:0000:0000"):
        self.gid = val

    @classmethod
    def from_ipv4(cls, ip: str) -> "GID":
        raw = ipaddress.IPv6Address("::ffff:" + ip).packed  # RoCEv2-style IPv4-mapped GID
        return cls(":".join(raw[i:i + 2].hex() for i in range(0, 16, 2)))

    def __str__(self) -> str:
        return self.gid


class GlobalRoute:
    def __init__(self, dgid: GID | None = None, flow_label: int = 0, sgid_index: int = 0, hop_limit: int = 1,
                 traffic_class: int = 0):
        self.dgid, self.flow_label, self.sgid_index = dgid, flow_label, sgid_index
        self.hop_limit, self.traffic_class = hop_limit, traffic_class


class AHAttr:
    """Flattened like pyverbs: the GRH fields are attributes of the AHAttr itself."""

    def __init__(self, dlid: int = 0, sl: int = 0, src_path_bits: int = 0, static_rate: int = 0, is_global: int = 0,
                 port_num: int = 1, gr: GlobalRoute | None = None):
        self.dlid, self.sl, self.src_path_bits, self.static_rate = dlid, sl, src_path_bits, static_rate
        self.is_global, self.port_num = is_global, port_num
        gr = gr or GlobalRoute()
        self.dgid, self.flow_label, self.sgid_index = gr.dgid, gr.flow_label, gr.sgid_index
        self.hop_limit, self.traffic_class = gr.hop_limit, gr.traffic_class
