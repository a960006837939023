"""A communicator's point-to-point operations (NCCL ``src/enqueue.cc``: ``p2pTaskAppend``, the planner's per-peer
send and receive queues, ``ncclLaunchKernel`` of a p2p plan; ``src/transport.cc``: ``ncclTransportP2pConnect``).

``send`` and ``recv`` queue a task on the peer's queue (and mark the round's channels to connect, connIndex 1).
At the group's end ``launch`` connects what is missing (``Connections.connect_p2p``), turns the queues into one
work per round and epoch (``enqueue_p2p``), hands the NET proxy its ops, and runs every channel's works in one
kernel (``device/sendrecv.py``).
Where we differ on purpose: a channel runs its works one after another (NCCL runs the up to 8 works of a batch
side by side: every rank meets its rounds in the same order, so nothing can wait in a circle), and the call
returns once the network has taken the last send, as collectives do here (``transports/proxy.py``).
"""
from __future__ import annotations

import collections
from typing import Callable

import numpy as np

from collectives.include.p2p_work import DevWorkP2p
from collectives.misc.param import env_int
from transports.connections import Connections

from . import enqueue_p2p
from .device import sendrecv
from .device.common import CollectiveError, run_in_order
from .health import DTYPE_NAMES
from .status import describe
from .graph.p2p_schedule import P2pChannels


class P2pTask:
    """``struct ncclTaskP2p``: one send or receive, its bytes as a uint8 view of the user's buffer."""

    def __init__(self, buff: np.ndarray, peer: int):
        self.buff, self.peer = buff, peer

    @property
    def nbytes(self) -> int:
        return len(self.buff)


class P2p:
    """The planner's p2p half for one communicator: per-peer queues, the p2p connectors, and the launch."""

    def __init__(self, rank: int, nranks: int, channels: P2pChannels, schedule: list[tuple[int, int]],
                 buff_sizes: dict):
        self.rank, self.nranks, self.channels, self.schedule = rank, nranks, channels, schedule
        self.buff_sizes = buff_sizes
        self.send_q: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self.recv_q: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self.conns: dict[tuple, object] = {}   # (peer, channel, "send" | "recv") -> Connector (connIndex 1)
        self.send_round = {s: r for r, (s, _) in enumerate(schedule)}  # the round of each send peer
        self.recv_round = {v: r for r, (_, v) in enumerate(schedule)}

    @property
    def pending(self) -> bool:
        return any(self.send_q.values()) or any(self.recv_q.values())

    def append(self, is_send: bool, buff: np.ndarray, peer: int) -> None:
        """``p2pTaskAppend``."""
        (self.send_q if is_send else self.recv_q)[peer].append(P2pTask(buff, peer))

    def clear(self) -> None:
        self.send_q.clear()
        self.recv_q.clear()

    def missing(self) -> dict:
        """``ncclTransportP2pConnect`` for every queued peer: the channels of its round not connected yet."""
        needs: dict = {}
        for queues, d, rounds in ((self.send_q, "send", self.send_round), (self.recv_q, "recv", self.recv_round)):
            for peer, q in queues.items():
                if not q or peer == self.rank:
                    continue
                chans = [c for c in self.channels.channels_of_round(rounds[peer]) if (peer, c, d) not in self.conns]
                if chans:
                    needs.setdefault(peer, {})[d] = chans
        return needs

    def connect(self, conns: Connections) -> None:
        needs = self.missing()
        if needs:
            self.conns.update(conns.connect_p2p(needs))

    def plan(self) -> list[tuple[DevWorkP2p, list]]:
        """``scheduleP2pTasksToPlan``: epoch after epoch, each round's first queued send and receive become one
        work (``addP2pToPlan``), until the queues are empty."""
        n_min, n_max = enqueue_p2p.channel_range(self.channels, self.nranks)
        ll_net = env_int("NCCL_ALLOC_P2P_NET_LL_BUFFERS", 0) == 1
        works = []
        while self.pending:
            for rnd, (send_rank, recv_rank) in enumerate(self.schedule):
                send = self.send_q[send_rank][0] if self.send_q[send_rank] else None
                recv = self.recv_q[recv_rank][0] if self.recv_q[recv_rank] else None
                if send is None and recv is None:
                    continue
                if send_rank == self.rank and (send is None) != (recv is None):
                    raise ValueError(f"rank {self.rank}: a {'send' if send else 'recv'} to itself without a matching "
                                     f"{'recv' if send else 'send'} in the same group")
                if send_rank == self.rank and send.nbytes != recv.nbytes:
                    raise ValueError(f"rank {self.rank}: a send of {send.nbytes} bytes to itself, received into "
                                     f"{recv.nbytes}")
                if send is not None:
                    self.send_q[send_rank].popleft()
                if recv is not None:
                    self.recv_q[recv_rank].popleft()
                if send_rank == self.rank and send.buff.ctypes.data == recv.buff.ctypes.data:
                    continue  # a send to oneself in place: nothing to move
                net = tuple(self._network(p, d) for p, d in ((recv_rank, "recv"), (send_rank, "send")))
                work, ops = enqueue_p2p.add_p2p_to_plan(
                    self.channels, self.rank, self.buff_sizes, n_min, n_max, rnd, send_rank,
                    send.nbytes if send else -1, recv_rank, recv.nbytes if recv else -1,
                    ll_buffers=(not net[0] or ll_net, not net[1] or ll_net), network=net)
                work.send_buff = send.buff if send else None
                work.recv_buff = recv.buff if recv else None
                work.p2p_round = rnd
                works.append((work, ops))
        return works

    def _network(self, peer: int, d: str) -> bool:
        conn = self.conns.get((peer, self.channels.channel_base_for_round(
            (self.send_round if d == "send" else self.recv_round)[peer]), d))
        return conn is not None and conn.proxy_conn is not None

    def prepare(self, conns: Connections | None) -> list[tuple[DevWorkP2p, list]]:
        """Connect what is missing and plan everything queued (``ncclTransportP2pSetup``, then
        ``scheduleP2pTasksToPlan``); the queues are empty afterwards, even on failure."""
        try:
            if conns is not None:
                self.connect(conns)
            return self.plan()
        finally:
            self.clear()

    def launch(self, kernel, conns: Connections | None) -> int:
        """Connect, plan and run everything queued (``groupLaunch`` → ``doLaunches`` for this communicator);
        returns how many works ran."""
        works = self.prepare(conns)
        proxy_ops = self.post(conns, works, kernel)
        kernel.run([run_in_order(seq) for seq in self.channel_works(kernel, works).values()])
        if proxy_ops:
            kernel.run([conns.wait_sent(kernel, proxy_ops)])
        return len(works)

    def post(self, conns: Connections | None, works: list, kernel) -> list:
        """``ncclProxySaveOp`` for every part of every work, in the kernel's order on each connection; runs of one
        protocol go together (a p2p op has one step per chunk: sliceSteps = chunkSteps = 1)."""
        if conns is None or not conns.proxied:
            return []
        kernel.poll, kernel.net_wait = conns.poll, conns.wait  # a blocked kernel moves its NET bytes itself
        posted, run, proto = [], [], None
        for _, ops in works:
            for op in ops:
                conn = self.conns[(op.peer, op.channel, "send" if op.is_send else "recv")]
                if op.proto != proto and run:
                    posted += conns.save_ops(run, proto, 1, 1, kernel.tracer, kernel.op_count)
                    run = []
                proto = op.proto
                run.append((conn, op.nsteps))
        if run:
            posted += conns.save_ops(run, proto, 1, 1, kernel.tracer, kernel.op_count)
        return posted

    def channel_works(self, kernel, works: list) -> dict[int, list[Callable[[], list]]]:
        """Per channel, a maker for each work's thread groups there (its send and receive side by side), in order.
        A work's primitives are built when the channel reaches it: they start from the connection's step where
        the work before left it."""
        by_channel: dict[int, list] = collections.defaultdict(list)
        for work, _ in works:
            nparts = max(work.n_send_channels, work.n_recv_channels)
            for part in range(nparts):
                c = self.channels.channel_for_part(work.channel_base, part)
                by_channel[c].append(lambda c=c, work=work: sendrecv.channel_works(
                    kernel, c, self.rank, work, self.conns.get((work.send_rank, c, "send")),
                    self.conns.get((work.recv_rank, c, "recv"))))
        return by_channel


def describe_works(works: list) -> str:
    """A plan's p2p works as an error line names them: each round's send and receive, peer and bytes."""
    parts = []
    for work, _ in works:
        ops = ([f"send {work.send_bytes} B to rank {work.send_rank}"] if work.n_send_channels else []) + \
              ([f"recv {work.recv_bytes} B from rank {work.recv_rank}"] if work.n_recv_channels else [])
        parts.append(f"round {work.p2p_round}: {', '.join(ops)}")
    return "; ".join(parts)


class P2pChecks:
    """What the p2p kernel checks while it waits: ``Health.check_p2p`` (a waited-for peer gone, aborted or
    destroyed), then ``check_moved_on``.  A peer that destroyed its communicator or moved on may have done so
    right after posting the last bytes this rank waits for, and the kernel last looked at its FIFOs before they
    came: a failure is raised only when a second check, one round of looking later, finds the same wait with
    still no progress (a p2p op has no opCount that would tell, as a collective's completed count does)."""

    def __init__(self, health):
        self.health = health
        self.suspect: tuple | None = None

    def __call__(self, kernel) -> None:
        try:
            self.health.check_p2p(kernel)
            check_moved_on(self.health, kernel)
        except CollectiveError as exc:
            seen = (kernel.op_count, kernel.progress)
            if exc.secondary or self.suspect == seen:
                raise
            self.suspect = seen  # look at the FIFOs once more first
            return
        self.suspect = None


def check_moved_on(health, kernel) -> None:
    """While a p2p kernel waits for a peer on this host: if that peer has already started the collective this rank
    will call next (its status page holds this opCount's signature), it cannot be posting what this rank waits for
    any more, and it waits for this rank in that collective: a deadlock, named now instead of at the deadline.  It
    is what a group split differently on the two ranks, or a send and recv of different sizes, end in."""
    for peer in {w[1] for w in kernel.wait_state.values()}:
        page = health.pages.get(peer)
        sig = page.signature(kernel.op_count) if page is not None and peer != health.rank else None
        if sig is not None:
            raise CollectiveError(
                f"rank {health.rank}: rank {peer} has moved on to {describe(sig, DTYPE_NAMES)} (opCount "
                f"{kernel.op_count}) while this rank's {kernel.func} still waits for it: rank {peer} posted fewer "
                f"bytes or operations for rank {health.rank} in this group (a size mismatch, or a group split "
                f"differently); this rank: {kernel.describe_wait()}")

