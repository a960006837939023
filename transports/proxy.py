"""The proxy (NCCL ``src/proxy.cc``): ``ncclProxyOp`` (``ProxyOp``), the thread that progresses a rank's ops
(``ncclProxyProgress``: ``Proxy``), and ours, ``wait_sent``.

The proxy knows nothing of networks.  A proxied connection (``ncclProxyConnection``; NET's ``NetConnection``)
carries its own ``progress(op)``, the transport's ``proxyProgress`` hook of ``struct ncclTransportComm``
(``sendProxyProgress`` / ``recvProxyProgress`` in ``src/transport/net.cc``): the proxy starts each op, calls its
connection's progress on the oldest op of each connection (messages stay in order), and retires it when ``done``
reaches ``nsteps``.  A transport that proxies says so through ``Transport.proxied`` and takes its ops through
``Transport.save_ops`` (``transports/base.py``).

Counters are NCCL's (``posted``, ``transmitted``, ``received``, ``done``) in units of ``sliceSteps``, from
``base = roundUp(resources->step, chunkSteps)``: the proxy keeps its own step counter per connection and, when it
starts an op, sets it to ``base + nsteps`` for the next one, so it never reads the kernel's.

Deliberate differences.  While its kernel waits, the rank moves its proxied bytes itself (``Proxy.progress``,
called from ``Kernel.run``'s ``poll``; a lock decides who runs it): a Python proxy thread would first have to win
the interpreter lock from its own rank, and with several ranks on few cores that hand-over, not the network, was
the cost of a step across nodes.  The thread remains for what is left when no kernel waits, and stays out while
its rank polls (``DEFER_S``).  With more ranks than cores, a rank whose kernel
waits on proxied connections only sleeps in ``select`` on their sockets (``Proxy.wait``) where NCCL's proxy spins:
spinning there takes a core from the rank that would send the bytes.  And a collective
returns only once its send ops are done (``wait_sent``), i.e. the plugin has taken every step.  NCCL's kernel
returns as soon as its last step is in the FIFO and its proxy, a free-running C thread, sends it whatever the
caller does next.  Ours is a Python thread: if the caller then enters a C call that keeps the GIL while it waits
for a peer (mpi4py's lowercase ``allreduce`` does), the last step would never leave and the peer, waiting for it,
would never reach that call.
"""
from __future__ import annotations

import collections
import select
import sys
import threading
import time

from collectives.include.bitops import round_up
from collectives.include.device import NCCL_STEPS
from collectives.include.protocols import PROTOCOLS


class ProxyError(RuntimeError):
    """A proxied connection failed (its transport's error, e.g. the net plugin's): the peer, the operation and the
    reason; the proxy reports it through the kernel's waits."""


class ProxyOp:
    """``ncclProxyOp``: one connection's part of one collective, ``nsteps`` steps of ``proto``."""

    def __init__(self, nc, proto: str, nsteps: int, slice_steps: int, chunk_steps: int, tracer=None, seq: int = 0,
                 reg=None):
        """``reg``: registered user buffers (``sub->reg``), the step -> address schedule the transport asks
        (``register.RegisteredSteps``); None: the FIFO slots."""
        self.nc, self.proto, self.nsteps, self.slice_steps = nc, proto, nsteps, slice_steps
        self.reg, self.reg_ready = reg, False
        self.protocol = PROTOCOLS[proto]
        self.tracer, self.seq = tracer, seq
        self.chunk_steps = chunk_steps
        self.t_start = 0
        self.step_t: dict = {}   # slot -> when its isend/irecv was issued, while in flight (tracing only)
        self.base = 0
        self.posted = self.transmitted = self.received = self.done = 0
        self.requests: dict = {}
        self.step_size = nc.conn.step_size(proto)  # whole lines per slot, as the kernel lays them out
        if tracer is not None:  # the transport's own events (NET/IB: CTS, WRs, completions) go to the same trace
            nc.trace_to(tracer, seq)

    def start(self) -> None:
        """``ncclProxyOpReady``: round the connection's step up to a chunk, and set where the next op starts."""
        nc = self.nc
        self.base = round_up(nc.step, self.chunk_steps)
        nc.step = self.base + self.nsteps
        self.t_start = time.monotonic_ns()

    @property
    def complete(self) -> bool:
        return self.done >= self.nsteps

    def trace_issue(self, slot: int) -> None:
        """The transport just issued this slot's message (tracing only)."""
        if self.tracer is not None:
            self.step_t[slot] = time.monotonic_ns()

    def trace_step(self, step: int, size: int) -> None:
        """The message of ``step`` completed, ``size`` bytes (tracing only)."""
        if self.tracer is None:
            return
        issued = self.step_t.pop(step % NCCL_STEPS, 0)  # the message is ready when it is issued: t0 = t_post
        conn = self.nc.conn
        self.tracer.add("proxy_step", self.seq, self.nc.channel, conn.peer, conn.is_send, step, step % NCCL_STEPS,
                        size, issued, issued, time.monotonic_ns())

    def trace_end(self) -> None:
        if self.tracer is not None:
            conn = self.nc.conn
            self.tracer.add("proxy_op", self.seq, self.nc.channel, conn.peer, conn.is_send, self.proto,
                            self.nsteps, self.t_start, time.monotonic_ns())


class _SentWait:
    """What ``wait_sent`` reports to the kernel while it waits (channel, thread group and primitive, as a
    primitives object would)."""
    group, tracer = 3, None

    def __init__(self, op: ProxyOp):
        self.channel, self.prim = op.nc.channel, "proxy send"


def wait_sent(kernel, ops: list):
    """Yield (a kernel work item) until every send op is done: the transport has taken each of its steps."""
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
# returns; napping longer leaves the cores to the ranks (docs/measured.md has the measurement).
NAP_S = 0.002
# While the rank's own thread moves the bytes (its blocked kernel calls ``progress``), this thread stays out for
# DEFER_S at a time: its passes would only take the interpreter lock from a kernel that moves them already
# (docs/measured.md has the measurement).
DEFER_S = 0.02


class Proxy(threading.Thread):
    """``ncclProxyProgress``: loops over active ops calling their connection's progress; new ops arrive from the
    kernel side (``post``, ``ncclProxySaveOp``)."""

    def __init__(self, rank: int):
        super().__init__(name=f"nccllab-proxy-rank{rank}", daemon=True)
        self.rank = rank
        self.pending: collections.deque = collections.deque()
        self.active: list = []  # connections with ops; only each one's oldest op progresses (messages stay in order)
        self.error: str | None = None
        self.stopping = False
        self.posted = threading.Event()  # set by post(): an idle proxy sleeps on it
        self.lock = threading.Lock()      # whoever progresses the ops: this thread or the waiting rank
        self.rank_polled = 0.0            # when the rank's own thread last called progress (monotonic s)
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
            if time.monotonic() - self.rank_polled < DEFER_S:
                time.sleep(DEFER_S)
                continue
            if not self.progress(thread=True):
                time.sleep(NAP_S)

    def progress(self, thread: bool = False) -> bool:
        """One pass: start the posted ops, then move each active connection's oldest op (messages stay in order).
        Called by this thread (``thread``), and by the rank itself while its kernel waits (``Kernel.run``'s
        ``poll``): whoever holds the lock moves the bytes, the other skips, so a blocked rank never waits for the
        interpreter to hand this thread its turn.  Returns whether anything moved."""
        if not thread:
            self.rank_polled = time.monotonic()
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
                progressed |= nc.progress(op)
                if op.complete:
                    op.trace_end()
                    nc.ops.popleft()
                    if not nc.ops:
                        self.active.remove(nc)
            return progressed
        except (ProxyError, OSError) as exc:
            self.error = f"{nc.describe_failure()} failed: {exc}"
            return False
        except Exception as exc:  # a bug: report it through the kernel rather than die silently
            where = f" on channel {nc.channel}" if nc is not None else ""
            self.error = f"proxy thread failed{where}: {type(exc).__name__}: {exc}"
            raise
        finally:
            self.lock.release()

    def wait(self, timeout_s: float) -> bool:
        """Ours: sleep in ``select`` until a file descriptor that an active op waits on is ready, at most
        ``timeout_s``, holding the lock so that nothing else takes the bytes first; or, while this thread holds the
        lock (it is moving bytes), until its pass ends.  For a rank whose blocked kernel waits on these connections
        only (``NetTransport.wait``): with more ranks than cores, polling or yielding keeps a core from the ranks
        that have work, and the OS wakes the thread as the data lands.  False, at once, when the ops offer nothing
        to wait on (the plugin has no descriptors, or they wait on the kernel)."""
        if self.error is not None or self.pending:
            return False
        if not self.lock.acquire(blocking=False):  # the thread is moving bytes: wait for its pass to end
            if not self.lock.acquire(timeout=timeout_s):
                return False
            self.lock.release()
            return True
        try:
            readable, writable = [], []
            for nc in self.active:
                r, w = nc.wait_fds(nc.ops[0])
                readable += r
                writable += w
            if not readable and not writable:
                return False
            try:
                select.select(readable, writable, [], timeout_s)
            except (OSError, ValueError):  # a socket closed under a failure: the next poll reports it
                return False
            return True
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
            self.join(timeout=2.0)  # it sleeps at most DEFER_S, or waits on ``posted``, just set
        self.pending.clear()
        self.active = []

    def drain(self, deadline_s: float) -> None:
        """Let the proxy finish what the last collective posted (within ``deadline_s``, not after a failure),
        then stop it."""
        end = time.monotonic() + deadline_s
        while not self.idle() and not self.error and time.monotonic() < end:
            time.sleep(0.001)
        self.stop()
