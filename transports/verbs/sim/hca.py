"""The software provider's HCA: one per device per process, shared by its contexts.

It owns the tables a real HCA keeps (QP numbers, memory keys), listens for requesters on a TCP port (that
port is its LID) and keeps one requester link per remote HCA (``wire.Link``).  A link whose TCP connection
breaks stands for a peer whose transport retries ran out: every QP addressed to that HCA goes to ERR at once
(real hardware would take ``timeout`` x ``retry_cnt`` to say the same).
"""
from __future__ import annotations

import itertools
import os
import threading
from collections import Counter

from collectives.misc import sockets

from . import chaos as chaos_mod
from . import enums as e

_hcas: dict = {}
_lock = threading.Lock()


def get_hca(name: str) -> "Hca":
    with _lock:
        key = (os.getpid(), name)
        if key not in _hcas:
            _hcas[key] = Hca(name)
        return _hcas[key]


class Hca:
    def __init__(self, name: str):
        from .wire import serve  # the listener thread
        self.name = name
        self.ip = "127.0.0.1"  # the stand-in's subnet is one host's loopback, whatever NCCL_SOCKET_IFNAME says
        self.srv = sockets.listen(self.ip)
        self.lid = self.srv.getsockname()[1]
        self.lock = threading.Lock()
        self.qps: dict = {}
        self.lkeys: dict = {}
        self.rkeys: dict = {}
        self.links: dict = {}
        self.dead_lids: set = set()
        self._qpn = itertools.count(0x100)
        self._key = itertools.count(0x1000)
        self.stats: Counter = Counter()  # writes, write_imm, bytes, rnr_waits, errors (the provider's counters)
        seed = chaos_mod.seed()
        self.chaos = chaos_mod.Chaos(seed) if seed is not None else None
        threading.Thread(target=serve, args=(self,), name=f"nccllab-sim-{name}-listen", daemon=True).start()

    # --- tables ----------------------------------------------------------------------------------------------
    def add_qp(self, qp) -> int:
        with self.lock:
            qpn = next(self._qpn)
            self.qps[qpn] = qp
        return qpn

    def remove_qp(self, qp) -> None:
        with self.lock:
            self.qps.pop(qp.qp_num, None)

    def register_mr(self, mr) -> tuple[int, int]:
        with self.lock:
            lkey, rkey = next(self._key), next(self._key) | 0x80000000
            self.lkeys[lkey], self.rkeys[rkey] = mr, mr
        return lkey, rkey

    def deregister_mr(self, mr) -> None:
        with self.lock:
            self.lkeys.pop(mr.lkey, None)
            self.rkeys.pop(mr.rkey, None)

    # --- requests --------------------------------------------------------------------------------------------
    def submit(self, op) -> None:
        qp = op.qp
        if qp.qp_state == e.IBV_QPS_ERR:
            qp.complete_send(op, e.IBV_WC_WR_FLUSH_ERR)
            return
        self.link(qp.dlid).submit(op)

    def link(self, dlid: int):
        from .wire import Link
        with self.lock:
            link = self.links.get(dlid)
            if link is None or link.dead:
                link = self.links[dlid] = Link(self, dlid)
            return link

    def peer_lost(self, lid: int) -> None:
        """The TCP link to/from HCA ``lid`` broke: QPs addressed to it go to ERR (posted receives flush)."""
        with self.lock:
            self.dead_lids.add(lid)
            victims = [qp for qp in self.qps.values() if qp.dlid == lid and qp.qp_state != e.IBV_QPS_RESET]
        for qp in victims:
            if qp.qp_state != e.IBV_QPS_ERR:
                qp.to_error()
