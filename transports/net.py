"""The NET transport and its proxy thread (NCCL ``src/transport/net.cc``: ``sendProxyProgress``,
``recvProxyProgress``; ``src/proxy.cc``: ``ncclProxyProgress``).

Across nodes the "GPU" (the kernel loop) never touches the network.  It fills and drains FIFO slots in *local*
memory exactly as over SHM, and writes each step's byte size into ``connFifo[slot]``.  A proxy thread per rank
drives the net plugin:

* send: a slot is ready when ``connFifo[slot] != -1`` and ``tail`` has passed it (Simple), or all its LL lines
  carry the step's flag, or all its LL128 lines do (host memory, no GDR); then ``isend``; when ``test`` says done,
  ``connFifo[slot] = -1`` and ``head = base + done`` returns the credit;
* recv: ``irecv`` into up to NCCL_STEPS slots ahead; when one completes, ``tail = base + transmitted`` lets the
  kernel consume it (LL/LL128 readers see the flags that arrived in the data); when the kernel's ``head`` passes a
  slot, it is ``done`` and may be posted again.

Counters are NCCL's (``posted``, ``transmitted``, ``received``, ``done``) in units of ``sliceSteps``, from
``base = roundUp(resources->step, chunkSteps)``: the proxy keeps its own step counter per connection and, when it
starts an op, sets it to ``base + nsteps`` for the next one, so it never reads the kernel's.  One op per
(channel, peer, direction) per collective, like ``ncclProxySaveOp``, with the exact number of steps the kernel
will move.

Deliberate differences.  While its kernel waits, the rank moves its proxied bytes itself (``Proxy.progress``,
called from ``Kernel.run``'s ``poll``; a lock decides who runs it): a Python proxy thread would first have to win
the interpreter lock from its own rank, and with several ranks on few cores that hand-over, not the network, was
the cost of a step across nodes.  The thread remains for what is left when no kernel waits.  And a collective
returns only once its send ops are done (``wait_sent``), i.e. the plugin has taken every step.  NCCL's kernel
returns as soon as its last step is in the FIFO and its proxy, a free-running C thread, sends it whatever the
caller does next.  Ours is a Python thread: if the caller then enters a C call that
keeps the GIL while it waits for a peer (mpi4py's lowercase ``allreduce`` does), the last step would never leave
and the peer, waiting for it, would never reach that call.
"""
from __future__ import annotations

import collections
import sys
import threading
import time

import numpy as np

from collectives.include.connector import Connector
from collectives.include.device import NCCL_STEPS
from collectives.include.protocols import PROTOCOLS, PROTOS
from collectives.misc import futex
from collectives.misc.param import timeout_s
from tracing import debug

from .base import CommInfo, Transport
from .net_plugin import NetError
from .net_select import select_plugin

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
    """One proxied connection: its connector and its plugin comm."""

    def __init__(self, plugin, connector: Connector, comm, channel: int):
        self.plugin, self.conn, self.comm, self.channel = plugin, connector, comm, channel
        connector.proxy_conn = self
        self.views = {p: memoryview(b) for p, b in connector.buffs.items()}
        self.ops: collections.deque = collections.deque()  # this connection's ops, strictly in order
        self.step = 0  # the proxy's own step counter (NCCL's resources->step): where the next op starts


class ProxyOp:
    def __init__(self, nc: NetConnection, proto: str, nsteps: int, slice_steps: int, chunk_steps: int,
                 tracer=None, seq: int = 0):
        self.nc, self.proto, self.nsteps, self.slice_steps = nc, proto, nsteps, slice_steps
        self.protocol = PROTOCOLS[proto]
        self.tracer, self.seq = tracer, seq
        self.chunk_steps = chunk_steps
        self.t_start = 0
        self.step_t: dict = {}   # slot -> when its isend/irecv was issued, while in flight (tracing only)
        self.base = 0
        self.posted = self.transmitted = self.received = self.done = 0
        self.requests: dict = {}
        self.step_size = nc.conn.step_size(proto)  # whole lines per slot, as the kernel lays them out
        if tracer is not None:  # the plugin's own events (NET/IB: CTS, WRs, completions) go to the same trace
            nc.plugin.trace_to(nc.comm, tracer, seq, nc.channel, nc.conn.peer)

    def start(self) -> None:
        """``ncclProxyOpReady``: round the connection's step up to a chunk, and set where the next op starts."""
        nc = self.nc
        self.base = -(-nc.step // self.chunk_steps) * self.chunk_steps
        nc.step = self.base + self.nsteps
        self.t_start = time.monotonic_ns()

    @property
    def complete(self) -> bool:
        return self.done >= self.nsteps

    def _trace_issue(self, slot: int) -> None:
        """isend/irecv of this slot was just issued (tracing only)."""
        if self.tracer is not None:
            self.step_t[slot] = time.monotonic_ns()

    def _trace_step(self, step: int, size: int) -> None:
        issued = self.step_t.pop(step % NCCL_STEPS, 0)  # the message is ready when it is issued: t0 = t_post
        conn = self.nc.conn
        self.tracer.add("proxy_step", self.seq, self.nc.channel, conn.peer, conn.is_send, step, step % NCCL_STEPS,
                        size, issued, issued, time.monotonic_ns())

    def trace_end(self) -> None:
        if self.tracer is not None:
            conn = self.nc.conn
            self.tracer.add("proxy_op", self.seq, self.nc.channel, conn.peer, conn.is_send, self.proto,
                            self.nsteps, self.t_start, time.monotonic_ns())

    def _slot(self, step: int, size: int) -> memoryview:
        start = (step % NCCL_STEPS) * self.step_size
        return self.nc.views[self.proto][start:start + size]

    def send_progress(self) -> bool:
        nc, conn, progressed = self.nc, self.nc.conn, False
        while self.posted < self.nsteps and self.posted < self.done + NCCL_STEPS:
            self.posted += self.slice_steps
        if self.transmitted < self.posted:
            step = self.base + self.transmitted
            slot = step % NCCL_STEPS
            size = int(conn.conn_fifo[slot])
            if size != -1 and self._ready(step, size):
                req = nc.plugin.isend(nc.comm, self._slot(step, size), size, 0, None)
                if req is not None:
                    self.requests[slot] = req
                    self.transmitted += self.slice_steps
                    progressed = True
                    self._trace_issue(slot)
        if self.done < self.transmitted:
            slot = (self.base + self.done) % NCCL_STEPS
            ok, sent = nc.plugin.test(self.requests[slot])
            if ok:
                if self.tracer is not None:
                    self._trace_step(self.base + self.done, sent)
                conn.conn_fifo[slot] = -1
                self.done += self.slice_steps
                conn.head[0] = self.base + self.done  # credit back to the kernel
                if conn.head_sleep[0]:
                    futex.wake(conn.head_addr)
                progressed = True
        return progressed

    def _ready(self, step: int, size: int) -> bool:
        """The protocol's rule (``Protocol.proxy_ready``) on this connection's slot."""
        conn = self.nc.conn
        return self.protocol.proxy_ready(conn.words[self.proto][step % NCCL_STEPS], int(conn.tail[0]), step, size)

    def recv_progress(self) -> bool:
        nc, conn, progressed = self.nc, self.nc.conn, False
        while self.posted < self.nsteps and self.posted < self.done + NCCL_STEPS:
            step = self.base + self.posted
            size = self.step_size * self.slice_steps
            req = nc.plugin.irecv(nc.comm, [self._slot(step, size)], [size], [0], [None])
            if req is None:
                break
            self.requests[step % NCCL_STEPS] = req
            self.posted += self.slice_steps
            progressed = True
            self._trace_issue(step % NCCL_STEPS)
        if self.received < self.posted:
            slot = (self.base + self.received) % NCCL_STEPS
            ok, got = nc.plugin.test(self.requests[slot])
            if ok:
                if self.tracer is not None:
                    self._trace_step(self.base + self.received, got)
                self.received += self.slice_steps
                self.transmitted = self.received  # no flush for host memory
                conn.tail[0] = self.base + self.transmitted
                if conn.tail_sleep[0]:
                    conn.doorbell[0] += 1
                    futex.wake(conn.tail_addr)
                    futex.wake(conn.bell_addr)
                progressed = True
        if self.done < self.transmitted and int(conn.head[0]) >= self.base + self.done + self.slice_steps:
            self.done += self.slice_steps
            progressed = True
        return progressed


class _SentWait:
    """What ``wait_sent`` reports to the kernel while it waits (channel, thread group and primitive, as a
    primitives object would)."""
    group, tracer = 3, None

    def __init__(self, op: ProxyOp):
        self.channel, self.prim = op.nc.channel, "proxy send"


def wait_sent(kernel, ops: list):
    """Yield (a kernel work item) until every send op is done: the plugin has taken each of its steps."""
    for op in ops:
        waiter, done = _SentWait(op), -1
        while not op.complete:
            if op.done != done:
                done = op.done
                kernel.progress += 1
            kernel.waiting(waiter, "proxy send", op.nc.conn.peer, op.base + op.done)
            yield
    kernel.progress += 1


# How long the proxy thread naps when its active ops make no progress.  The rank's own thread moves the bytes
# while its kernel waits (``progress``), so this thread only has to finish what is left after a collective
# returns; napping longer leaves the 2 cores to the ranks (4 ranks, 8 B across 2 emulated nodes: 850 us with
# 20 us naps, 420 us with 1 ms, 400 us with 5 ms).
NAP_S = 0.002


class Proxy(threading.Thread):
    """``ncclProxyProgress``: loops over active ops calling their progress; new ops arrive from the kernel side."""

    def __init__(self, rank: int):
        super().__init__(name=f"nccllab-proxy-rank{rank}", daemon=True)
        self.rank = rank
        self.pending: collections.deque = collections.deque()
        self.active: list = []  # connections with ops; only each one's oldest op progresses (messages stay in order)
        self.error: str | None = None
        self.stopping = False
        self.posted = threading.Event()  # set by post(): an idle proxy sleeps on it
        self.lock = threading.Lock()      # whoever progresses the ops: this thread or the waiting rank
        sys.setswitchinterval(0.0002)  # the kernel loop and the proxy share the GIL: switch often

    def post(self, ops: list) -> None:
        self.pending.extend(ops)
        self.posted.set()

    def idle(self) -> bool:
        return not self.pending and not self.active

    def run(self) -> None:
        while not self.stopping and self.error is None:
            if not self.pending and not self.active:  # nothing to do: sleep until ops come (NCCL waits on its
                self.posted.wait(0.5)                    # pool's condition variable), costing the ranks no CPU
                self.posted.clear()
                continue
            if not self.progress():
                time.sleep(NAP_S)

    def progress(self) -> bool:
        """One pass: start the posted ops, then move each active connection's oldest op (messages stay in order).
        Called by this thread, and by the rank itself while its kernel waits (``Kernel.run``'s ``poll``): whoever
        holds the lock moves the bytes, the other skips, so a blocked rank never waits for the interpreter to hand
        this thread its turn.  Returns whether anything moved."""
        if self.error is not None or not self.lock.acquire(blocking=False):
            return False
        nc = None
        try:
            while self.pending:
                op = self.pending.popleft()
                op.start()
                if not op.nc.ops:
                    self.active.append(op.nc)
                op.nc.ops.append(op)
            progressed = False
            for nc in list(self.active):
                op = nc.ops[0]
                progressed |= op.send_progress() if nc.conn.is_send else op.recv_progress()
                if op.complete:
                    op.trace_end()
                    nc.ops.popleft()
                    if not nc.ops:
                        self.active.remove(nc)
            return progressed
        except (NetError, OSError) as exc:
            self.error = f"NET connection with rank {nc.conn.peer} (channel {nc.channel}) failed: {exc}"
            return False
        except Exception as exc:  # a bug: report it through the kernel rather than die silently
            where = f" on channel {nc.channel}" if nc is not None else ""
            self.error = f"proxy thread failed{where}: {type(exc).__name__}: {exc}"
            raise
        finally:
            self.lock.release()

    def describe(self) -> list[dict]:
        """Where each active connection's oldest op stands, for a hang report (read without the lock: a snapshot
        taken under the interpreter lock, good enough to see which side stopped)."""
        out = []
        for nc in list(self.active):
            ops = list(nc.ops)
            if not ops:
                continue
            op = ops[0]
            out.append({"channel": nc.channel, "peer": nc.conn.peer, "dir": "send" if nc.conn.is_send else "recv",
                        "proto": op.proto, "base": op.base, "nsteps": op.nsteps, "posted": op.posted,
                        "transmitted": op.transmitted, "received": op.received, "done": op.done,
                        "queued_ops": len(ops)})
        return out

    def stop(self) -> None:
        """``ncclProxyStop``, then ``commFree``'s join: the thread ends before its connections close."""
        self.stopping = True
        self.posted.set()
        if self.is_alive():
            self.join(timeout=2.0)  # it naps at most NAP_S, or waits on ``posted``, just set
        self.pending.clear()
        self.active = []


class NetState:
    """One communicator's NET resources: the plugin, the listening endpoints of pending receives, every proxied
    connection, and the proxy thread."""

    def __init__(self, info):
        self.info = info
        self.plugin = select_plugin()
        self.via = f"NET/{self.plugin.name}/0"
        self.listens: dict = {}
        self.connections: list[NetConnection] = []
        self.proxy: Proxy | None = None


class NetTransport(Transport):
    """``netTransport``: the kernel fills local FIFOs, the proxy moves them through the net plugin."""
    name = NAME

    def can_connect(self, my_info: dict, peer_info: dict) -> bool:
        return True  # netCanConnect: any two ranks

    def new_state(self, info: CommInfo) -> NetState:
        return NetState(info)

    def setup(self, state: NetState, channel: int, peer: int, is_send: bool):
        """The receiver listens and publishes the plugin's handle; the sender has nothing to publish."""
        if is_send:
            return b""
        handle, state.listens[(channel, peer)] = state.plugin.listen(0)
        return handle

    def connect(self, state: NetState, channel: int, peer: int, is_send: bool, my_blob, peer_blob,
                deadline: float) -> Connector:
        info, plugin = state.info, state.plugin
        me, dev = info.rank, info.dev
        conn = make_connector(peer, is_send, info.buff_sizes, state.via)
        if is_send:
            comm = plugin.connect(0, peer_blob, deadline)
            line = f"Channel {channel:02d}/0 : {me}[{dev(me)}] -> {peer}[{dev(peer)}] [send] via {state.via}"
        else:
            comm = plugin.accept(state.listens[(channel, peer)], deadline)
            line = f"Channel {channel:02d}/0 : {peer}[{dev(peer)}] -> {me}[{dev(me)}] [receive] via {state.via}"
        state.connections.append(NetConnection(plugin, conn, comm, channel))
        debug.info("INIT|NET", line)
        return conn

    def connected(self, state: NetState) -> None:
        for lc in state.listens.values():
            state.plugin.close_listen(lc)
        state.listens = {}
        if state.connections and state.proxy is None:
            state.proxy = Proxy(state.info.rank)
            state.proxy.start()

    def progress(self, state: NetState) -> bool:
        return state.proxy.progress() if state.proxy is not None else False

    def describe(self, state: NetState) -> list[dict]:
        return state.proxy.describe() if state.proxy is not None else []

    def error(self, state: NetState) -> str | None:
        return state.proxy.error if state.proxy is not None else None

    def free(self, state: NetState, drain: bool = True) -> None:
        """Let the proxy finish what the last collective posted (within the deadline, and not after a failure),
        then close."""
        if state.proxy is not None:
            end = time.monotonic() + (timeout_s() if drain else 0)
            while not state.proxy.idle() and not state.proxy.error and time.monotonic() < end:
                time.sleep(0.001)
            state.proxy.stop()
            state.proxy = None
        for lc in state.listens.values():
            state.plugin.close_listen(lc)
        for nc in state.connections:
            (nc.plugin.close_send if nc.conn.is_send else nc.plugin.close_recv)(nc.comm)
            nc.conn.proxy_conn, nc.views, nc.comm = None, {}, None  # the connector <-> connection cycle
            nc.ops.clear()
        state.listens, state.connections = {}, []
