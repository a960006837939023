"""A communicator's health while its kernels wait (NCCL ``comm->abortFlag`` and ``ncclCommAbort``; the rest is
ours, because NCCL waits forever): the status pages of the local peers (``status.py``), the checks a waiting kernel
runs every few milliseconds, the signature check before a peer's first data is used, the early WARN line, and the
hang report a failing rank writes.

``check`` raises a ``CollectiveError`` naming the culprit when a transport failed (NET's proxy), a local peer
aborted (a *secondary* error: that peer reports the cause), died, destroyed its communicator before this
collective, or called a different collective (count, type, op or root).  ``suspects`` adds stopped processes to a
deadline message.  ``fail`` is what a rank does when its collective fails: raise its abort flag and write its
report where the run says (``tracing.hang.report_dir``), printing the path unless the error is secondary.
"""
from __future__ import annotations

import faulthandler
import os
import signal
import socket
import sys
import time
from typing import Callable

import numpy as np

from collectives.include.device import NCCL_STEPS
from collectives.misc import sockets
from tracing import debug
from tracing.hang import MISMATCH, failure_kind, report_dir, write_report

from .device.common import CollectiveError
from .device.reduce_copy import DTYPE_CODES
from .status import StatusPage, describe

DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}
# what a rank calls its report, by ``tracing.hang.failure_kind``: only a deadline is a hang
REPORT_NAMES = {"mismatch": "mismatch report", "hang": "hang report", "error": "failure report"}


def install_stack_dump() -> None:
    """SIGUSR1 prints every thread's Python stack to stderr (what ``Health.ask_for_stacks`` asks for); kept if
    the program already handles SIGUSR1."""
    if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None) and hasattr(faulthandler, "register"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


class Health:
    def __init__(self, rank: int, nranks: int, tag: str, peer_info: list[dict], bootstrap, local_ranks: list[int],
                 transport_error: Callable[[], str | None], transport_state: Callable[[], list] = list):
        self.rank, self.nranks, self.tag, self.peer_info = rank, nranks, tag, peer_info
        self.transport_error, self.transport_state = transport_error, transport_state
        self.signature: tuple = ()
        self.pages: dict[int, StatusPage] = {}
        self.mine = StatusPage.create(f"nccllab-{tag}-r{rank}-status")
        self.pages[rank] = self.mine
        install_stack_dump()
        try:
            bootstrap.barrier()
            for r in local_ranks:
                if r != rank:
                    self.pages[r] = StatusPage.attach(f"nccllab-{tag}-r{r}-status")
            bootstrap.barrier()
        finally:
            self.mine.seg.unlink()  # every local peer has mapped it

    def publish(self, op_count: int, signature: tuple, sig: np.ndarray, python: bool = True) -> None:
        """Before any data moves: this rank's call, for the peers to compare with theirs.  ``sig`` is the same as
        [opCount + 1, *signature] for the compiled path, which writes it to the page itself (``python=False``)."""
        self.signature = signature
        sig[0] = op_count + 1
        if python:
            self.mine.publish(op_count, signature)

    def check(self, kernel) -> None:
        """Called while ``kernel`` waits: raise if whatever it waits for can no longer come.  A local peer that
        called something else is looked for first, on every page: it is the cause, and a peer's abort or a
        transport failure seen first would only be its echo (issue 24: a mismatch reported as a hang)."""
        for r, page in self.pages.items():
            if r != self.rank:
                sig = page.signature(kernel.op_count)
                if sig is not None and sig != self.signature:
                    self._mismatch(r, sig, kernel.op_count)
        self.check_alive(kernel)

    def check_p2p(self, kernel) -> None:
        """What a point-to-point kernel checks while it waits: ``check`` without the signatures (its peers run
        other operations, and publish none), and a peer that exited or destroyed its communicator only matters
        if the kernel waits for it (the others may be done with theirs)."""
        self.check_alive(kernel, {w[1] for w in kernel.wait_state.values()})

    def check_peer(self, peer: int, why: str) -> None:
        """Outside a kernel (a p2p setup waiting for ``peer``): raise if that local peer aborted, exited or
        destroyed its communicator, so the wait ends now rather than at the deadline; ``why`` says what this rank
        waited for."""
        page = self.pages.get(peer)
        if page is None or peer == self.rank:
            return  # a rank on another node: only the deadline can tell
        if page.aborted:
            raise CollectiveError(f"rank {self.rank}: rank {peer} aborted [{page.message}]; {why}", secondary=True)
        if not sockets.pid_alive(self.peer_info[peer]["pid"]):
            raise CollectiveError(f"rank {self.rank}: rank {peer} (pid {self.peer_info[peer]['pid']}) is gone "
                                  f"(killed or exited): {why}")
        if page.destroyed:
            raise CollectiveError(f"rank {self.rank}: rank {peer} destroyed its communicator: {why}")

    def check_alive(self, kernel, waited: set | None = None) -> None:
        """A transport failed, or a local peer aborted, exited or destroyed its communicator (of those, only the
        ``waited`` ones when given)."""
        failure = self.transport_error()
        if failure:
            raise CollectiveError(f"rank {self.rank}: {failure}; during {kernel.func}: {kernel.describe_wait()}")
        for r, page in self.pages.items():
            if r == self.rank:
                continue
            if page.aborted:
                raise CollectiveError(f"rank {self.rank}: rank {r} aborted [{page.message}]; this rank, in "
                                      f"{kernel.func}: {kernel.describe_wait()}", secondary=True)
            if waited is not None and r not in waited:
                continue
            if not sockets.pid_alive(self.peer_info[r]["pid"]):
                raise CollectiveError(f"rank {self.rank}: rank {r} (pid {self.peer_info[r]['pid']}) is gone "
                                      f"(killed or exited) during {kernel.func}: {kernel.describe_wait()}")
            if page.destroyed and page.completed <= kernel.op_count:
                raise CollectiveError(f"rank {self.rank}: rank {r} destroyed its communicator after "
                                      f"{page.completed} collectives, so it will never join {kernel.func} "
                                      f"(opCount {kernel.op_count}); this rank: {kernel.describe_wait()}")

    def check_peer_op(self, peer: int, op_count: int) -> None:
        """Before consuming a peer's first data of this collective: it must be running the same call."""
        page = self.pages.get(peer)
        if page is not None:
            sig = page.signature(op_count)
            if sig != self.signature:
                self._mismatch(peer, sig, op_count)

    def _mismatch(self, peer: int, sig, op_count: int) -> None:
        theirs = describe(sig, DTYPE_NAMES) if sig else "a different collective (opCount differs)"
        raise CollectiveError(f"rank {self.rank}: {MISMATCH} with rank {peer} at opCount {op_count}: "
                              f"this rank called {self.call()}, rank {peer} called {theirs}")

    def call(self) -> str:
        """This rank's current collective as the mismatch line writes it: ``AllReduce(count=4096, ...)``."""
        return describe(self.signature, DTYPE_NAMES) if self.signature else ""

    def suspects(self) -> str:
        """For a deadline message: local peers whose process is stopped (SIGSTOP, a debugger)."""
        stopped = [f"rank {r} (pid {self.peer_info[r]['pid']}) is stopped" for r in self.pages
                   if r != self.rank and sockets.pid_state(self.peer_info[r]["pid"]) in ("T", "t")]
        return "; " + ", ".join(stopped) if stopped else ""

    @staticmethod
    def warn(msg: str) -> None:
        """A WARN line that the user sees even without ``NCCL_DEBUG`` (an early hang warning, a report's path)."""
        if debug.enabled("WARN"):
            debug.warn(msg)
        else:
            os.write(2, f"NCCL WARN {msg}\n".encode(errors="replace"))

    def fail(self, exc: CollectiveError, kernel, tracer) -> None:
        """This rank's collective failed: raise the abort flag, then write the report (``tracing.hang``).  After
        a deadline, first ask the ranks on this host for their Python stacks: a peer that is not waiting in a
        collective (so printed no WARN line) shows where it is instead.  A mismatch is reported as one, never as
        a hang: its report is written even when this rank found it before blocking (a rank missing from the
        reports is what the hang analysis blames), and its line says "mismatch report" (a deadline's says "hang
        report", any other failure's "failure report")."""
        if exc.timed_out:
            self.ask_for_stacks()
        self.mine.abort(str(exc))
        kind = failure_kind(str(exc), exc.timed_out)
        if kernel is not None and (kernel.wait_state or kind == "mismatch"):
            path = write_report(report_dir(self.tag), self._report(kernel, str(exc), tracer, kind))
            if not exc.secondary:  # the rank that knows names the folder; its peers' reports go beside it
                self.warn(f"rank {self.rank}: {REPORT_NAMES[kind]} written to {path} (python -m tracing hang "
                          f"{os.path.dirname(path)})")
        debug.warn(str(exc))

    def ask_for_stacks(self) -> None:
        """SIGUSR1 to every other rank on this machine: ``install_stack_dump`` makes each print its threads'
        stacks to its stderr (``NCCLLAB_HANG_STACKS=0``: not)."""
        if os.environ.get("NCCLLAB_HANG_STACKS", "1") == "0":
            return
        here = socket.gethostname()
        asked = []
        for r, info in enumerate(self.peer_info):
            if r != self.rank and info.get("host") == here and sockets.pid_alive(info["pid"]):
                try:
                    os.kill(info["pid"], signal.SIGUSR1)
                    asked.append(str(r))
                except OSError:
                    pass
        if asked:
            self.warn(f"rank {self.rank}: ranks {','.join(asked)} on this host print their Python stacks "
                      f"(SIGUSR1; NCCLLAB_HANG_STACKS=0 to skip)")
            time.sleep(0.2)  # before the abort flag ends their waits

    def _report(self, kernel, error: str, tracer, kind: str) -> dict:
        waits = [{"channel": ch, "what": what, "peer": peer, "step": step, "slot": step % NCCL_STEPS, "prim": prim}
                 for (ch, _), (what, peer, step, _, _, prim) in sorted(kernel.wait_state.items())]
        last = [dict(kind=k, values=list(v)) for k, v in tracer.records[-8:]] if tracer is not None else []
        return {"rank": self.rank, "nranks": self.nranks, "pid": os.getpid(), "func": kernel.func,
                "op_count": kernel.op_count, "kind": kind, "call": self.call(), "waits": waits, "error": error,
                "last_events": last, "proxy": self.transport_state()}

    def destroyed(self, completed: int) -> None:
        """This rank destroyed its communicator after ``completed`` collectives: a peer waiting in a later one
        learns it now."""
        self.mine.mark_destroyed(completed)

    def peer_aborted(self) -> tuple[int, str] | None:
        return next(((r, p.message) for r, p in self.pages.items() if r != self.rank and p.aborted), None)

    def close(self) -> None:
        """The communicator is destroyed (after ``destroyed`` marked our page): unmap every status page, and
        drop the callbacks into the communicator, so that no reference cycle keeps either alive."""
        for page in self.pages.values():
            page.close()
        self.pages = {}
        self.transport_error, self.transport_state = (lambda: None), list
