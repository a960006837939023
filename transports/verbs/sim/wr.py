"""Work requests (pyverbs ``pyverbs.wr``: ``SGE``, ``SendWR``, ``RecvWR``) for the software verbs provider."""
from __future__ import annotations

from . import enums as e
from .error import SimVerbsError


class SGE:
    def __init__(self, addr: int = 0, length: int = 0, lkey: int = 0):
        self.addr, self.length, self.lkey = addr, length, lkey


class SendWR:
    def __init__(self, wr_id: int = 0, opcode: int = e.IBV_WR_SEND, num_sge: int = 0, imm_data: int = 0,
                 sg: list | None = None, send_flags: int = 0):
        if num_sge < 1 or not sg:  # pyverbs refuses zero-SGE WRs too: a zero-byte write carries a 0-length SGE
            raise SimVerbsError("A WR needs at least one SGE")
        self.wr_id, self.opcode, self.num_sge, self.imm_data = wr_id, opcode, num_sge, imm_data
        self.sg, self.send_flags = list(sg)[:num_sge], send_flags
        self.rkey = self.remote_addr = 0

    def set_wr_rdma(self, rkey: int, addr: int) -> None:
        self.rkey, self.remote_addr = rkey, addr


class RecvWR:
    def __init__(self, wr_id: int = 0, num_sge: int = 0, sg: list | None = None):
        if num_sge < 1 or not sg:
            raise SimVerbsError("A WR needs at least one SGE")  # as pyverbs says
        self.wr_id, self.num_sge, self.sg = wr_id, num_sge, list(sg)[:num_sge]
