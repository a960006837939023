"""The NET transport (NCCL ``src/transport/net.cc``: ``netTransport``, ``sendProxyProgress``,
``recvProxyProgress``); the proxy thread that calls them is ``transports/proxy.py`` (``src/proxy.cc``).

Across nodes the "GPU" (the kernel loop) never touches the network.  It fills and drains FIFO slots in *local*
memory exactly as over SHM, and writes each step's byte size into ``connFifo[slot]``.  The rank's proxy drives the
net plugin through each connection's progress:

* send: a slot is ready when ``connFifo[slot] != -1`` and ``tail`` has passed it (Simple), or all its LL lines
  carry the step's flag, or all its LL128 lines do (host memory, no GDR); then ``isend``; when ``test`` says done,
  ``connFifo[slot] = -1`` and ``head = base + done`` returns the credit;
* recv: ``irecv`` into up to NCCL_STEPS slots ahead; when one completes, ``tail = base + transmitted`` lets the
  kernel consume it (LL/LL128 readers see the flags that arrived in the data); when the kernel's ``head`` passes a
  slot, it is ``done`` and may be posted again.

Each ring or tree connection opens on the net device the topology search chose for its channel
(``CommInfo.net_dev``: ``ncclTopoGetNetDev`` in ``sendSetup``/``recvSetup``), both ends on their own node's choice;
without a topology, and for point-to-point connections, device 0.  A choice past the plugin's devices (the socket
plugin has one) falls back to device 0: on purpose unlike NCCL, whose plugin would have that many devices.

With registered user buffers (``collectives/register.py``: Ring/Simple AllReduce, ``sub->reg``) an op carries
``reg``, the ring's schedule of user-buffer addresses (``ring_algo.RingAR``): the send side takes each step's
bytes from the user's send or receive buffer instead of the slot, and the receive side, once the kernel has marked
``connFifo`` (``regBufferReady``), receives each step straight into the user's receive buffer.  Head, tail and the
sizes in ``connFifo`` work as before.

One op per (channel, peer, direction) per collective, like ``ncclProxySaveOp``, with the exact number of steps the
kernel will move.  A plugin failure (``NetError``) reaches the proxy as a ``ProxyError`` naming the connection.
"""
from __future__ import annotations

import collections

import numpy as np

from collectives.include.connector import Connector
from collectives.include.device import NCCL_STEPS
from collectives.include.protocols import PROTOS
from collectives.misc import futex
from collectives.misc.param import timeout_s
from tracing import debug

from .base import CommInfo, Transport
from .net_plugin import NetError
from .net_select import select_plugin
from .proxy import Proxy, ProxyError, ProxyOp

NAME = "NET"


def make_connector(peer: int, is_send: bool, buff_sizes: dict, transport: str) -> Connector:
    """A NET connector: FIFOs, head, tail and connFifo all in this rank's memory (the proxy moves the bytes)."""
    z32 = lambda: np.zeros(1, np.uint32)  # noqa: E731
    conn = Connector(peer=peer, is_send=is_send, buffs={p: np.zeros(buff_sizes[p], np.uint8) for p in PROTOS},
                     head=np.zeros(1, np.uint64), tail=np.zeros(1, np.uint64), head_sleep=z32(), tail_sleep=z32(),
                     doorbell=z32(), transport=transport)
    conn.conn_fifo = np.full(NCCL_STEPS, -1, np.int64)
    return conn


class NetConnection:
    """One proxied connection (``ncclProxyConnection``): its connector, its plugin comm, its ops in order and the
    proxy's step counter."""

    def __init__(self, plugin, connector: Connector, comm, channel: int):
        self.plugin, self.conn, self.comm, self.channel = plugin, connector, comm, channel
        connector.proxy_conn = self
        self.views = {p: memoryview(b) for p, b in connector.buffs.items()}
        self.ops: collections.deque = collections.deque()  # this connection's ops, strictly in order
        self.step = 0  # the proxy's own step counter (NCCL's resources->step): where the next op starts
        self._progress = send_proxy_progress if connector.is_send else recv_proxy_progress

    def progress(self, op) -> bool:
        """The proxy's hook (``ncclTransportComm::proxyProgress``): move ``op``, this connection's oldest op."""
        try:
            return self._progress(op)
        except NetError as exc:
            raise ProxyError(str(exc)) from exc

    def wait_fds(self, op) -> tuple[list, list]:
        """The file descriptors whose readiness would move ``op`` (``NetPlugin.wait_fds``) when it waits on the
        network: a send whose oldest step the plugin has not finished, a receive whose oldest posted step has not
        arrived.  Empty when it waits on the kernel instead (a slot to fill or to free)."""
        pending = op.done if self.conn.is_send else op.received
        if pending >= (op.transmitted if self.conn.is_send else op.posted):
            return [], []
        return self.plugin.wait_fds(op.requests[(op.base + pending) % NCCL_STEPS])

    def trace_to(self, tracer, seq: int) -> None:
        """The plugin's own events (NET/IB: CTS, WRs, completions) go to the collective's trace."""
        self.plugin.trace_to(self.comm, tracer, seq, self.channel, self.conn.peer)

    def describe_failure(self) -> str:
        return f"NET connection with rank {self.conn.peer} (channel {self.channel})"


def _slot(op: ProxyOp, step: int, size: int) -> memoryview:
    start = (step % NCCL_STEPS) * op.step_size
    return op.nc.views[op.proto][start:start + size]


def send_ready(op: ProxyOp, step: int, size: int) -> bool:
    """Whether ``step``'s slot may go: the protocol's rule (``Protocol.proxy_ready``) on this connection's slot."""
    conn = op.nc.conn
    return op.protocol.proxy_ready(conn.words[op.proto][step % NCCL_STEPS], int(conn.tail[0]), step, size)


def send_proxy_progress(op: ProxyOp) -> bool:
    """``sendProxyProgress``: post the slots the credits allow, ``isend`` each once the kernel has filled it,
    and when the plugin says one is done free its slot and return the credit (``head``)."""
    nc, conn, progressed = op.nc, op.nc.conn, False
    while op.posted < op.nsteps and op.posted < op.done + NCCL_STEPS:
        op.posted += op.slice_steps
    if op.transmitted < op.posted:
        step = op.base + op.transmitted
        slot = step % NCCL_STEPS
        size = int(conn.conn_fifo[slot])
        if size != -1 and send_ready(op, step, size):
            if op.reg is None:
                buf, mhandle = _slot(op, step, size), None
            else:  # registered buffers: the step's slice of the user's buffer (getNextSendAddr)
                buf, got, mhandle = op.reg.send(op.transmitted)
                if got != size:
                    raise ProxyError(f"registered send step {step}: the kernel moved {size} bytes, the ring's "
                                     f"schedule says {got}")
            req = nc.plugin.isend(nc.comm, buf, size, 0, mhandle)
            if req is not None:
                op.requests[slot] = req
                op.transmitted += op.slice_steps
                progressed = True
                op.trace_issue(slot)
    if op.done < op.transmitted:
        slot = (op.base + op.done) % NCCL_STEPS
        ok, sent = nc.plugin.test(op.requests[slot])
        if ok:
            op.trace_step(op.base + op.done, sent)
            conn.conn_fifo[slot] = -1
            op.done += op.slice_steps
            conn.head[0] = op.base + op.done  # credit back to the kernel
            if conn.head_sleep[0]:
                futex.wake(conn.head_addr)
            progressed = True
    return progressed


def recv_proxy_progress(op: ProxyOp) -> bool:
    """``recvProxyProgress``: ``irecv`` into up to NCCL_STEPS slots ahead, hand each completed one to the kernel
    (``tail``), and count a slot done once the kernel's ``head`` has passed it."""
    nc, conn, progressed = op.nc, op.nc.conn, False
    if op.reg is not None and not op.reg_ready:  # the user's buffer is ours once the kernel has started the
        if conn.conn_fifo[op.base % NCCL_STEPS] == -1:  # call (it marks connFifo in NetRegMode: regBufferReady)
            return False
        op.reg_ready = True
    while op.posted < op.nsteps and op.posted < op.done + NCCL_STEPS:
        step = op.base + op.posted
        if op.reg is None:
            size = op.step_size * op.slice_steps
            buf, mhandle = _slot(op, step, size), None
        else:  # registered buffers: straight into the user's buffer (getNextRecvAddr)
            buf, size, mhandle = op.reg.recv(op.posted)
        req = nc.plugin.irecv(nc.comm, [buf], [size], [0], [mhandle])
        if req is None:
            break
        op.requests[step % NCCL_STEPS] = req
        op.posted += op.slice_steps
        progressed = True
        op.trace_issue(step % NCCL_STEPS)
    if op.received < op.posted:
        slot = (op.base + op.received) % NCCL_STEPS
        ok, got = nc.plugin.test(op.requests[slot])
        if ok:
            op.trace_step(op.base + op.received, got)
            conn.conn_fifo[slot] = -1
            op.received += op.slice_steps
            op.transmitted = op.received  # no flush for host memory
            conn.tail[0] = op.base + op.transmitted
            if conn.tail_sleep[0]:
                conn.doorbell[0] += 1
                futex.wake(conn.tail_addr)
                futex.wake(conn.bell_addr)
            progressed = True
    if op.done < op.transmitted and int(conn.head[0]) >= op.base + op.done + op.slice_steps:
        op.done += op.slice_steps
        progressed = True
    return progressed

class NetState:
    """One communicator's NET resources: the plugin, the listening endpoints of pending receives, every proxied
    connection, and the proxy thread."""

    def __init__(self, info):
        self.info = info
        self.plugin = select_plugin()
        self.devs: dict = {}     # (channel, peer, is_send, conn_index) -> the net device setup chose
        self.listens: dict = {}
        self.connections: list[NetConnection] = []
        self.proxy: Proxy | None = None
        self.words: set = set()  # id() of each connector's head, tail and doorbell: the words a kernel waits on


class NetTransport(Transport):
    """``netTransport``: the kernel fills local FIFOs, the proxy moves them through the net plugin."""
    name = NAME

    def can_connect(self, my_info: dict, peer_info: dict) -> bool:
        return True  # netCanConnect: any two ranks

    def new_state(self, info: CommInfo) -> NetState:
        return NetState(info)

    def setup(self, state: NetState, channel: int, peer: int, is_send: bool, conn_index: int = 0,
              graph: int = -1):
        """Choose the net device; the receiver listens on it and publishes the plugin's handle, the sender has
        nothing to publish."""
        choose = state.info.net_dev
        dev = choose(graph, channel) if choose is not None and graph >= 0 else 0
        dev = state.devs[(channel, peer, is_send, conn_index)] = dev if dev < state.plugin.devices() else 0
        if is_send:
            return b""
        handle, state.listens[(channel, peer, conn_index)] = state.plugin.listen(dev)
        return handle

    def connect(self, state: NetState, channel: int, peer: int, is_send: bool, my_blob, peer_blob,
                deadline: float, conn_index: int = 0) -> Connector:
        info, plugin = state.info, state.plugin
        me, dev = info.rank, info.dev
        net_dev = state.devs.pop((channel, peer, is_send, conn_index))
        via = f"NET/{plugin.name}/{net_dev}"
        conn = make_connector(peer, is_send, info.buff_sizes, via)
        if is_send:
            comm = plugin.connect(net_dev, peer_blob, deadline)
            line = f"Channel {channel:02d}/{conn_index} : {me}[{dev(me)}] -> {peer}[{dev(peer)}] [send] via {via}"
        else:
            comm = plugin.accept(state.listens[(channel, peer, conn_index)], deadline)
            line = f"Channel {channel:02d}/{conn_index} : {peer}[{dev(peer)}] -> {me}[{dev(me)}] [receive] via {via}"
        state.connections.append(NetConnection(plugin, conn, comm, channel))
        state.words |= {id(conn.head), id(conn.tail), id(conn.doorbell)}
        debug.info("INIT|NET", line)
        return conn

    def connected(self, state: NetState) -> None:
        for lc in state.listens.values():
            state.plugin.close_listen(lc)
        state.listens = {}
        if state.connections and state.proxy is None:
            state.proxy = Proxy(state.info.rank)
            state.proxy.start()

    def proxied(self, state: NetState) -> bool:
        return bool(state.connections)

    def save_ops(self, state: NetState, ops: list) -> None:
        mine = [op for op in ops if isinstance(op.nc, NetConnection)]
        if state.proxy is not None and mine:
            state.proxy.post(mine)

    def progress(self, state: NetState) -> bool:
        return state.proxy.progress() if state.proxy is not None else False

    def wait(self, state: NetState, words: list, timeout_s: float) -> bool:
        """Sleep in the proxy's ``select`` when every word the kernel waits on is one of our connections' (None:
        a proxy send), so that only the network can move it; with an SHM peer among them, False at once."""
        if state.proxy is None or not words or not all(w is None or id(w) in state.words for w in words):
            return False
        return state.proxy.wait(timeout_s)

    def describe(self, state: NetState) -> list[dict]:
        return state.proxy.describe() if state.proxy is not None else []

    def error(self, state: NetState) -> str | None:
        return state.proxy.error if state.proxy is not None else None

    def free(self, state: NetState, drain: bool = True) -> None:
        """Let the proxy finish what the last collective posted (within the deadline, and not after a failure),
        then close."""
        if state.proxy is not None:
            state.proxy.drain(timeout_s() if drain else 0)
            state.proxy = None
        for lc in state.listens.values():
            state.plugin.close_listen(lc)
        for nc in state.connections:
            (nc.plugin.close_send if nc.conn.is_send else nc.plugin.close_recv)(nc.comm)
            nc.conn.proxy_conn, nc.views, nc.comm = None, {}, None  # the connector <-> connection cycle
            nc.ops.clear()
        state.listens, state.connections = {}, []
