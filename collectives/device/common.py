"""The kernel: run each channel's share of one collective (NCCL ``src/device/common.h``: ``ncclKernelMain``,
one CUDA block per channel).

Each channel's work is a generator (``run_ring`` ...) that yields whenever it would spin on head or tail.  The
kernel steps them round-robin in this one process, so every channel progresses whatever the others wait for.
When nothing moves, it spins a little, then gives the CPU away with ``sched_yield`` (8 ranks on 2 cores must all
progress), and every few milliseconds checks the deadline, the peers' abort flags and whether they are alive.
NCCL spins on ``*comm->abortFlag`` every 10 000 loads; we add the deadline so that no wait is endless, and a
WARN line once a wait has gone ``NCCLLAB_WARN_AFTER`` seconds without progress (NCCL prints nothing: a user of a
hung job cannot tell whom it waits for, NVIDIA/nccl#1260).
On an oversubscribed machine (more ranks on it than cores, emulated nodes counted together since they share the
cores) a blocked rank sleeps on the counter it waits for (``futex``) instead of spinning, so that the rank it
waits for gets the core; when every counter it waits for is a NET connection's, it sleeps in ``select`` on their
sockets instead (``net_wait``: only the network can move them, and the OS wakes it as the bytes land).
"""
from __future__ import annotations

import os
import time
from typing import Callable, Iterator

from collectives.misc.param import timeout_s, warn_after_s

from tracing.events import now

from collectives.misc import futex

SPINS_BEFORE_YIELD = 4
SPINS_BEFORE_SLEEP = 20  # oversubscribed only: sched_yield first, then sleep (measured best)
# ... and only once the wait has lasted this long: a short wait (a small message, a NET hop) is cheaper yielded
# than slept and woken (the runs that chose it: docs/measured.md).
SPIN_S_BEFORE_SLEEP = 0.001
CHECK_EVERY_S = 0.02
# Oversubscribed, waiting on NET connections only: the longest sleep in ``select`` before the health checks.
NET_WAIT_S = 0.005
# Thread groups of one channel (runTreeSplit's reduce-up and broadcast-down halves, a p2p work's send and recv, run
# side by side).
GROUPS = {0: "", 1: "tree reduce", 2: "tree broadcast", 3: "proxy", 4: "p2p send", 5: "p2p recv"}


class CollectiveError(RuntimeError):
    """A collective failed on this rank; the message names the rank, channel, step and peer concerned.
    ``secondary``: this rank only learnt that a peer failed (its abort flag); the peer reports the cause.
    ``timed_out``: the deadline passed with nothing moving (the peers on this host are asked for their stacks)."""

    def __init__(self, message: str, secondary: bool = False, timed_out: bool = False):
        super().__init__(message)
        self.secondary, self.timed_out = secondary, timed_out


class Kernel:
    def __init__(self, rank: int, op_count: int, func: str, health: Callable[["Kernel"], None],
                 check_peer_op: Callable[[int], None], oversubscribed: bool = False,
                 suspects: Callable[[], str] = str, warn: Callable[[str], None] = print):
        """``suspects()`` adds what is known of the peers to a deadline message (e.g. a stopped process);
        ``warn`` prints the early WARN line."""
        self.rank, self.op_count, self.func = rank, op_count, func
        self.suspects, self.warn = suspects, warn
        self.sleep = oversubscribed and futex.AVAILABLE
        self.ranks_per_core = 1.0  # the ranks on this machine over its cores (the compiled waits read it)
        self.tracer = None
        self.progress = 0
        self.wait_state: dict[tuple, tuple] = {}
        self._health = health
        self.check_peer_op = check_peer_op
        self.poll: Callable[[], bool] | None = None  # moves proxied (NET) bytes from this thread while blocked
        # (words waited on, timeout) -> whether it slept until the network could move them (``Connections.wait``)
        self.net_wait: Callable[[list, float], bool] | None = None

    def free(self) -> None:
        """The communicator is destroyed: drop what the kernel still points at (the words of its last waits,
        views of shared memory that would keep their mapping open; the communicator's callbacks)."""
        self.wait_state.clear()
        self.poll = self.net_wait = self.tracer = None
        self._health = self.check_peer_op = lambda *args: None

    def reset(self, op_count: int, func: str) -> None:
        """One kernel object serves a communicator's calls: this one is ``func`` at ``op_count``."""
        self.op_count, self.func, self.progress = op_count, func, 0
        self.wait_state.clear()

    def waiting(self, prims, what: str, peer: int, step: int, word=None, mark=None) -> None:
        """Record what a channel spins on (timeout message, hang report, the word to sleep on).  Only called
        while blocked, so it may cost a little."""
        self.wait_state[(prims.channel, prims.group)] = (what, peer, step, word, mark, prims.prim)
        if prims.tracer is not None:
            prims.t_wait = now()

    def describe_wait(self) -> str:
        parts = []
        for (ch, group), (what, peer, step, _, _, prim) in sorted(self.wait_state.items()):
            side = (f"head from rank {peer} (send credit)" if what == "head" else
                    f"the network to take it (send to rank {peer})" if what == "proxy send" else
                    f"{what} from rank {peer} (recv)")  # tail, or an LL / LL128 flag
            where = f" ({GROUPS[group]}, {prim})" if group else ""
            parts.append(f"channel {ch}{where} step {step} waiting for {side}")
        return "; ".join(parts) or "no wait recorded"

    def _arm(self):
        """Mark the line of the counter the first blocked channel waits for, and remember its value *before* the
        generators re-check their conditions; a post after that read changes the value, so the sleep returns."""
        for what, peer, step, word, mark, _ in self.wait_state.values():
            if word is not None:
                value = int(word[0]) & 0xFFFFFFFF
                mark[0] = 1
                return futex.address(word), value, mark
        return None

    def run(self, works: list[Iterator], spins_before_yield: int = SPINS_BEFORE_YIELD,
            spins_before_sleep: int = SPINS_BEFORE_SLEEP) -> None:
        """Step ``works`` round-robin until all end.  A blocked round spins, then yields the core, then (more
        local ranks than cores) sleeps on the counter it waits for; the spin counts are the caller's to tune."""
        active = list(works)
        deadline_s, warn_s = timeout_s(), warn_after_s()
        warned = False
        last_progress, last_change = -1, time.monotonic()
        next_check = last_change + CHECK_EVERY_S
        spins, armed = 0, None
        while active:
            for g in list(active):
                try:
                    next(g)
                except StopIteration:
                    active.remove(g)
                    self.progress += 1
            if self.progress != last_progress:
                if armed is not None:  # it moved before we slept: take the mark back (a stale one costs the
                    armed[2][0], armed = 0, None  # poster a futex wake on every post)
                last_progress, spins = self.progress, 0
                self.wait_state.clear()
                last_change = time.monotonic()
                next_check = last_change + CHECK_EVERY_S
                warned = False
                continue
            spins += 1
            if self.poll is not None and self.poll():
                spins = 0
                continue  # this rank moved NET bytes itself: look again at once
            if self.sleep and self.net_wait is not None and self.wait_state and self.net_wait(
                    [state[3] for state in self.wait_state.values()], NET_WAIT_S):
                pass  # it slept until a socket it waits on was ready: poll it at once
            elif spins < spins_before_yield:
                continue
            elif self.sleep and spins >= spins_before_sleep and time.monotonic() - last_change > SPIN_S_BEFORE_SLEEP:
                if armed is None:
                    armed = self._arm()
                    if armed is not None:
                        continue  # one more round with the mark set, then sleep
                    os.sched_yield()  # nothing to sleep on (the proxy's sends): do not spin hot
                else:
                    futex.wait(armed[0], armed[1])
                    armed[2][0], armed = 0, None
            else:
                os.sched_yield()
            now = time.monotonic()
            if now < next_check:
                continue
            next_check = now + CHECK_EVERY_S
            self._health(self)
            if now - last_change > deadline_s:
                raise CollectiveError(
                    f"rank {self.rank}: {self.func} (opCount {self.op_count}) made no progress for "
                    f"{deadline_s:g} s (NCCLLAB_TIMEOUT): {self.describe_wait()}{self.suspects()}", timed_out=True)
            if not warned and now - last_change > warn_s:
                warned = True
                self.warn(f"rank {self.rank}: {self.func} (opCount {self.op_count}) has made no progress for "
                          f"{warn_s:g} s (NCCLLAB_WARN_AFTER): {self.describe_wait()}{self.suspects()}")


def run_in_order(makers: list[Callable[[], list[Iterator]]]) -> Iterator:
    """One channel's works of a plan, one after another (NCCL: a block walks its channel's work batches in
    order), each work's thread groups side by side; a work's generators are made when the channel reaches it.
    ``Kernel.run`` steps one such generator per channel.  The inner round robin is ``Kernel.run``'s, written again
    without its progress accounting: ``Kernel.run`` counts progress inline on every collective's hot path."""
    for make in makers:
        active = make()
        while active:
            for g in list(active):
                try:
                    next(g)
                except StopIteration:
                    active.remove(g)
            if active:
                yield

