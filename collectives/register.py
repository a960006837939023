"""User buffer registration (NCCL ``src/register/register.cc``: ``ncclCommRegister``, ``ncclCommDeregister``,
``ncclRegFind``; ``src/register/coll_reg.cc``: ``ncclRegisterCollBuffers``' Ring branch; ``src/transport/net.cc``:
``ncclNetLocalRegisterBuffer``).

``comm.register(array)`` records the array's address range and returns a handle; nothing moves yet.  When a Ring
AllReduce over Simple then finds both its send and receive buffers inside registered ranges, and the channel has a
NET connection, the call runs NCCL's ``NCCL_NET_REG_BUFFER`` path: the net plugin registers the buffer on each NET
connection the first time (``reg_mr``: an IB memory region; the socket plugin needs none), the proxy sends from and
receives into the user's buffers at the addresses ``ring_algo.RingAR`` gives for each step, and the kernel, in
``NetRegMode``, reduces straight in the output and writes no NET FIFO slot (``prims_simple.py``,
``simple_compiled.py``).  Every other call, and every SHM or P2P connection, uses the FIFOs as before.

Like NCCL, registration is skipped in place (the peer's partial sum would land on the input still to be added),
for avg (``ncclDevPreMulSum``, ``ncclDevSumPostDiv``), with ``NCCL_LOCAL_REGISTER=0``, and unless the receive
buffer is registered; and, as NCCL's ring has a NET send on some channel whenever it has a NET receive, unless the
send buffer is registered too.  A NET send connection registers both buffers, a NET receive only the output.

Deliberate differences:
* NCCL also needs GPUDirect RDMA (``useGdr``) for the NIC to reach GPU memory, and ``ncclRegister`` skips
  host-backed memory; our buffers are host memory, which any NIC reaches.
* NCCL page-aligns a registration and finds any range inside it; ``register`` counts a reference only for the
  very same range (a range inside another is a registration of its own), and ``find`` looks inside as NCCL does.
* NCCL also registers Ring AllGather/Broadcast, Tree, CollNet and NVLS buffers; here only Ring AllReduce.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from collectives.misc.futex import address
from collectives.misc.param import env_int
from tracing import debug

from .ring_algo import RingAR


@dataclass
class Registration:
    """``struct ncclReg``: one registered range, the array that owns it (kept alive while registered), how many
    times it was registered (``localRefs``), and the plugin's memory handle per NET connection."""
    begin: int
    nbytes: int
    array: np.ndarray
    refs: int = 1
    mhandles: dict = field(default_factory=dict)  # NetConnection -> the plugin's mhandle

    @property
    def bytes(self) -> memoryview:
        return memoryview(self.array.reshape(-1).view(np.uint8))


def local_register() -> bool:
    return env_int("NCCL_LOCAL_REGISTER", 1) != 0


class Registry:
    """``comm->regCache``: a communicator's registrations."""

    def __init__(self, rank: int):
        self.rank = rank
        self.regs: list[Registration] = []

    def register(self, comm_id: int, array) -> Registration | None:
        """``ncclCommRegister``: None (and an INFO line) when NCCL_LOCAL_REGISTER=0, as NCCL returns a NULL handle."""
        if not isinstance(array, np.ndarray):
            raise TypeError(f"register: expected a numpy array, got {type(array).__name__} (only host buffers "
                            f"register here)")
        if not array.flags.c_contiguous:
            raise ValueError("register: the buffer must be C-contiguous (a registration is one address range)")
        begin, nbytes = address(array), array.nbytes
        if not local_register():
            debug.info("REG", f"Skipping registration for buffer {hex(begin)} size {nbytes} (LocalRegister=0, "
                              f"P2pUsesMemcpy=0)")
            return None
        for reg in self.regs:  # the same range again: one more reference (ncclRegister's cache lookup)
            if reg.begin == begin and reg.nbytes == nbytes:
                reg.refs += 1
                return reg
        reg = Registration(begin, nbytes, array)
        self.regs.append(reg)
        debug.info("REG", f"register comm {hex(comm_id)} buffer {hex(begin)} size {nbytes}")
        return reg

    def deregister(self, reg: Registration | None) -> None:
        """``ncclCommDeregister``: a None handle is fine; an unknown one is an error, as in NCCL."""
        if reg is None:
            return
        if not any(r is reg for r in self.regs):
            raise ValueError("deregister: could not find handle (not registered on this communicator, or "
                             "already deregistered)")
        reg.refs -= 1
        if reg.refs == 0:
            self._release(reg)
            self.regs = [r for r in self.regs if r is not reg]

    def find(self, begin: int, nbytes: int) -> Registration | None:
        """``ncclRegFind``: the registration whose range holds ``[begin, begin + nbytes)``."""
        for reg in self.regs:
            if reg.begin <= begin and begin + nbytes <= reg.begin + reg.nbytes:
                return reg
        return None

    def pair(self, send: np.ndarray, recv: np.ndarray) -> tuple | None:
        """(send registration, receive registration) when each buffer lies in one, else None: ``ncclGetAlgoInfo``'s
        ``regBuff`` (what a tuner plugin is told), and the lookup ``ring_net`` makes before using them."""
        sreg = self.find(address(send), send.nbytes)
        rreg = self.find(address(recv), recv.nbytes) if sreg is not None else None
        return (sreg, rreg) if rreg is not None else None

    def ring_net(self, task, send: np.ndarray, recv: np.ndarray) -> tuple | None:
        """``ncclRegisterCollBuffers`` for a Ring AllReduce: (send registration, receive registration) when this
        call takes the NET registered path, else None."""
        plan = task.plan
        # avg: NCCL leaves PreMulSum and SumPostDiv out; here it is needed too, as PreMulSum's reduce_copy writes
        # the scaled input into the output before it reads the peer's slice, which in NetRegMode lies there
        if not self.regs or plan.algo != "Ring" or plan.proto != "Simple" or task.func != "AllReduce" \
                or task.op == "avg" or not task.counts or not local_register():
            return None
        if address(send) == address(recv):  # in place: a received slice would land on the input it needs
            return None
        return self.pair(send, recv)  # NCCL: the input too once a ring step is sent through NET (nNodes > 1)

    def mhandle(self, reg: Registration | None, nc):
        """The plugin's handle of ``reg`` on connection ``nc``, registered the first time
        (``ncclNetLocalRegisterBuffer`` → the proxy's ``regMr``)."""
        if reg is None:
            return None
        if nc not in reg.mhandles:
            reg.mhandles[nc] = nc.plugin.reg_mr(nc.comm, reg.bytes)
            debug.info("REG", f"rank {self.rank} - NET register userbuff {hex(reg.begin)} (handle "
                              f"{hex(id(reg))}), buffSize {reg.nbytes}")
        return reg.mhandles[nc]

    def _release(self, reg: Registration) -> None:
        for nc, mh in reg.mhandles.items():
            if mh is not None and nc.comm is not None:
                nc.plugin.dereg_mr(nc.comm, mh)
            debug.info("REG", f"rank {self.rank} - deregistered net buffer handle {hex(id(reg))}")
        reg.mhandles = {}

    def free(self) -> None:
        """The communicator is destroyed: every memory handle goes before its connection closes."""
        for reg in self.regs:
            self._release(reg)
        self.regs = []


def ring_algos(registry: Registry, regs: tuple, plan, channels: list, nranks: int, send: np.ndarray,
               recv: np.ndarray, slice_steps: int, chunk_steps: int) -> dict | None:
    """``addCollToPlan``'s ``new RingARAlgorithm`` per channel: {id(connector): the proxy's view of the step
    addresses} for each NET connector of the ring (``RegisteredSteps``), or None when the ring has none."""
    sreg, rreg = regs
    esize = send.itemsize
    views = {"send": memoryview(send.reshape(-1).view(np.uint8)), "recv": memoryview(recv.reshape(-1).view(np.uint8))}
    out = {}
    for w in plan.works:
        ch = channels[w.channel]
        step_bytes = ch.send.step_size("Simple")
        algo = RingAR(ch.ring.index, nranks, chunk_steps, slice_steps, w.chunk_count * esize,
                      step_bytes * slice_steps, w.part_offset * esize, w.part_count * esize, esize)
        # as ncclRegisterCollBuffers: a NET send registers both buffers (a ring step sends from the input or
        # from the output), a NET receive only the output it lands in
        for conn, bufs in ((ch.send, {"send": sreg, "recv": rreg}), (ch.recv, {"recv": rreg})):
            nc = conn.proxy_conn
            if nc is None:
                continue
            handles = {which: registry.mhandle(reg, nc) for which, reg in bufs.items()}
            out[id(conn)] = RegisteredSteps(algo, views, handles)
    return out or None  # no NET connection on any channel: nothing registered runs, the FIFOs carry it all


class RegisteredSteps:
    """What the proxy asks of one registered op: the memory (and the plugin's handle) of each step, from
    ``RingAR``."""

    def __init__(self, algo: RingAR, views: dict, handles: dict):
        self.algo, self.views, self.handles = algo, views, handles

    def send(self, step: int) -> tuple[memoryview, int, object]:
        which, offset, size = self.algo.send_addr(step)
        return self.views[which][offset:offset + size], size, self.handles[which]

    def recv(self, step: int) -> tuple[memoryview, int, object]:
        _, offset, size = self.algo.recv_addr(step)
        return self.views["recv"][offset:offset + size], size, self.handles["recv"]
