"""Ring collectives in one compiled call: the same primitive calls as ``runRing<T, RedOp, Proto>`` (NCCL
``src/device/all_reduce.h`` & co.), executed by one numba function per protocol: ``ll_compiled.run_ops`` (what
``prims_ll.h`` does for each call, or ``prims_ll128.h`` with LL128's lines) and ``simple_compiled.run_ops``
(``prims_simple.h``).

The readable path is the generator algorithms (``all_reduce.run_ring`` ...) over the protocol's primitives.  This
module does not restate the algorithms: ``record`` runs the very same ``run_ring`` against a recorder and keeps the
list of primitive calls it makes (``send``, ``recv_reduce_send``, ...: offsets, element counts, recv/send), once per
plan.  The protocol's ``run_ops`` then executes that list per channel, doing what the readable ``generic_op`` does
for each call, on the same memory, flags, head/tail and step counters and in the same summation order, so results
are bitwise the readable path's; the tests (``tests/test_ll_compiled.py``, ``tests/test_simple_compiled.py``) run
both on the same inputs and compare bit patterns.

Everything ``run_ops`` touches is in one int64 control array (``compiled_common``: the parameters, this call's
signature, and per channel the addresses of its FIFOs, head, tail, sleep marks and step counters plus where it
stands), so a call costs four arguments.

A tree (``runTreeSplit``, Simple) is recorded the same way, one row per thread group: the root's, or a rank's
reduce group (receiving from ``down[]``, sending to ``up``) and broadcast group (the other way); the Simple kernel
waits on, reduces from and posts to every peer of a row, as ``FanAsymmetric`` primitives do.

A call runs here when the plan is a ring (LL, LL128 or Simple) or a Tree/Simple AllReduce (``runTreeSplit``, not
``NCCLLAB_TREE_UPDOWN``), nothing is traced (the trace needs the readable path's events), the type is one numba
computes natively (not float16/bfloat16) and the op is not avg; ``NCCLLAB_LL_COMPILED=0``,
``NCCLLAB_LL128_COMPILED=0`` and ``NCCLLAB_SIMPLE_COMPILED=0`` turn each protocol off, and the communicator says
at INFO which path runs.  ``run_ops`` spins at most ``max_idle`` rounds without progress, then
returns what each channel waits for, so that the kernel's wait policy (yield, futex sleep, health checks, deadline,
hang report) stays the one in ``common.Kernel``; with more ranks than cores it first waits itself, the way
``Kernel.run`` would (``compiled_common.blocked``).  User buffers that partly overlap never get here
(``api.check_overlap`` refuses them); exact in-place calls agree.  Tree/LL and Tree/LL128 run the readable
primitives. Deliberate difference: NCCL has only the compiled kernel; this one exists because the Python primitives
cost tens of microseconds per call, which hides what the protocols are for.
"""
from __future__ import annotations

import numpy as np

from collectives.include.bitops import div_up
from collectives.include.device import LL_CLEAN_MASK, LL_FLAG_MOD
from collectives.misc import futex
from collectives.misc.param import env_int
from tracing import debug

from . import all_reduce, ll_compiled, simple_compiled
from .compiled_common import (CANON, CLEAN_MASK, COLS, DESC_COLS, DESC_ROWS, DONE, END, FIFO, FIRST, FLAG_MOD,
                              HEADER, IS_FLOAT, LL128, MAX_IDLE, MAX_PEERS, MISMATCH, MOVES, MY_DESC, NCH, NRECV,
                              NSEND, PC, PDESC, PROG, PRIM, PRIMS, R_DOORBELL, R_HEADSLEEP, R_TAILSLEEP, RB, RHEAD,
                              RREG, RSTAGE, RSTEP_W, RTAIL, RWORDS, S_DOORBELL, S_HEADSLEEP, S_TAILSLEEP, SB, SHEAD,
                              SLEEPS, SPC, SPS, SREG, SSTAGE, SSTEP_W, STAIL, STEP_BYTES, SWORDS, WAIT, WAIT_HEAD,
                              WAIT_MISMATCH, WAIT_TAIL, WPEER, WSTEP, YIELDS)
from .reduce_copy import CANONICAL_NAN

SUPPORTED = {np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float32,
                                   np.float64)}
SWITCHES = {"LL": "NCCLLAB_LL_COMPILED", "LL128": "NCCLLAB_LL128_COMPILED", "Simple": "NCCLLAB_SIMPLE_COMPILED"}
KERNELS = {"LL": ll_compiled.run_ops, "LL128": ll_compiled.run_ops, "Simple": simple_compiled.run_ops}


def enabled(proto: str = "LL") -> bool:
    return proto in SWITCHES and env_int(SWITCHES[proto], 1) != 0


def eligible(plan, dtype: np.dtype, redop_name: str, tracing: bool) -> bool:
    """Whether a call runs here rather than through the readable primitives."""
    tree = plan.algo == "Tree" and plan.proto == "Simple" and not all_reduce.tree_up_down()
    return ((plan.algo == "Ring" or tree) and plan.proto in SWITCHES and not tracing
            and np.dtype(dtype) in SUPPORTED and (redop_name != "avg" or plan.func in ("AllGather", "Broadcast"))
            and enabled(plan.proto))


class _Recorder:
    """Stands in for a primitives object: each named primitive appends one row and moves nothing.  ``max_bytes``:
    the most one call may carry (LL: one step; Simple: one slice of StepPerSlice steps), which the readable
    primitives refuse or cannot slice and numba would not check.  ``recv``/``send``: the connectors of a tree's
    thread group (NCCL's ``Primitives`` constructor arguments), kept for its row."""

    def __init__(self, esize: int, max_bytes: int, slices: int = 1, recv=(), send=(), group: int = 0):
        self.esize, self.max_bytes, self.slices, self.rows = esize, max_bytes, slices, []
        self.recv_conns, self.send_conns, self.group = list(recv), list(send), group

    def finished(self, gen):
        """A thread group's work, then the destructor (nothing to save: the kernel keeps the steps)."""
        yield from gen

    def _add(self, prim: str, recv: int, send: int, src, dst, nelem: int, from_output: int = 0):
        nelem = max(nelem, 0)
        per_call = div_up(nelem, 16 * self.slices) * 16 if self.slices > 1 else nelem  # Simple's sliceSize
        if per_call * self.esize > self.max_bytes:
            raise ValueError(f"compiled call of {nelem * self.esize} B exceeds what it may carry "
                             f"({self.max_bytes} B a {'slice' if self.slices > 1 else 'step'})")
        self.rows.append((recv, send, -1 if src is None else src, -1 if dst is None else dst, nelem,
                          from_output, PRIMS.index(prim)))
        return iter(())

    def send(self, inp, n):
        return self._add("send", 0, 1, inp, None, n)

    def send_from_output(self, out, n):
        return self._add("send_from_output", 0, 1, out, None, n, 1)

    def copy_send(self, inp, out, n):
        return self._add("copy_send", 0, 1, inp, out, n)

    def recv(self, out, n):
        return self._add("recv", 1, 0, None, out, n)

    def recv_reduce_send(self, inp, n):
        return self._add("recv_reduce_send", 1, 1, inp, None, n)

    def recv_reduce_copy(self, inp, out, n, post_op=False):
        return self._add("recv_reduce_copy", 1, 0, inp, out, n)

    def recv_reduce_copy_send(self, inp, out, n, post_op=False):
        return self._add("recv_reduce_copy_send", 1, 1, inp, out, n)

    def recv_copy_send(self, out, n):
        return self._add("recv_copy_send", 1, 1, None, out, n)


def record(run, ring, work, nranks: int, root: int, in_place: bool, esize: int, max_bytes: int,
           slices: int = 1) -> np.ndarray:
    """The primitive calls that ``run`` (a function's ``runRing``, ``launch.RING``) makes for one channel's work,
    as rows of ``REC..PRIM``."""
    rec = _Recorder(esize, max_bytes, slices)
    for _ in run(rec, ring, work, nranks, root, in_place):
        pass
    return _calls(rec)


def _calls(rec: _Recorder) -> np.ndarray:
    return np.array(rec.rows, np.int64).reshape(-1, 7)


def record_tree(ch, work, esize: int, max_bytes: int) -> list[tuple[np.ndarray, list, list, int]]:
    """``runTreeSplit`` on one channel's work, as (calls, receive connectors, send connectors, thread group) per
    thread group: the root's one, or the reduce and the broadcast group (``all_reduce.run_tree_split``)."""
    recorders = []

    def prims(recv_peers, send_peers, group: int):  # launch._tree_works' constructor, recording
        rec = _Recorder(esize, max_bytes, 1, *ch.connectors(recv_peers, send_peers), group)
        if len(rec.recv_conns) > MAX_PEERS or len(rec.send_conns) > MAX_PEERS:
            raise ValueError(f"a tree group with more than {MAX_PEERS} peers on one side")
        recorders.append(rec)
        return rec

    for gen in all_reduce.run_tree_split(prims, ch.tree, work):
        for _ in gen:
            pass
    return [(_calls(r), r.recv_conns, r.send_conns, r.group) for r in recorders]


class _Row:
    """One row of a compiled plan: a ring channel, or one thread group of a tree channel, with its connectors."""
    __slots__ = ("channel", "group", "recv", "send")

    def __init__(self, channel, group: int, recv: list, send: list):
        self.channel, self.group, self.recv, self.send = channel, group, recv, send


class Compiled:
    """One plan of one communicator, ready to run: the recorded calls of every row (ring channel, or tree thread
    group) and the memory they use."""

    def __init__(self, plan, run, channels: list, nranks: int, root: int, in_place: bool, dtype: np.dtype,
                 pages: dict, my_page):
        proto = self.proto = plan.proto
        self.kernel = KERNELS[proto]
        step_bytes = channels[plan.works[0].channel].recv.step_size(proto)
        spc, sps = (plan.chunk_steps // plan.slice_steps, plan.slice_steps) if proto == "Simple" else (1, 1)
        max_bytes = {"Simple": step_bytes * sps, "LL": step_bytes // 2,  # LL128: whole wire slices of 1920 B
                     "LL128": step_bytes // 2048 * ll_compiled.LL128_SLICE_DATA}[proto]
        progs, self.rows, self.ring = [], [], plan.algo == "Ring"
        for w in plan.works:
            ch = channels[w.channel]
            if plan.algo == "Tree":
                for calls, recv, send, group in record_tree(ch, w, dtype.itemsize, max_bytes):
                    progs.append(calls)
                    self.rows.append(_Row(ch, group, recv, send))
            else:
                progs.append(record(run, ch.ring, w, nranks, root, in_place, dtype.itemsize, max_bytes, spc))
                self.rows.append(_Row(ch, 0, [ch.recv], [ch.send]))
        self.prog = np.ascontiguousarray(np.concatenate(progs), np.int64)
        self.keep = [self.prog]  # everything whose address is in ctl stays alive as long as this object
        self.rfifo: list[int] = []  # per row: its NET receive's connFifo (0: not NET, or not a ring)
        self.registered = False
        self.waits: tuple | None = None  # the wait policy last written to ctl (``run``)
        ctl = self.ctl = np.zeros(HEADER + COLS * len(self.rows), np.int64)
        addr = lambda a: self.keep.append(a) or futex.address(a)  # noqa: E731
        first = 0
        for c, (r, prog) in enumerate(zip(self.rows, progs)):
            row = self.row(c)
            row[NRECV], row[NSEND] = len(r.recv), len(r.send)
            for b, rc in enumerate(r.recv):
                page = pages.get(rc.peer)
                at = b * RB
                words = rc.words[proto] if proto != "Simple" else rc.buffs[proto]  # LL/LL128: 64-bit words
                row[[RWORDS + at, RHEAD + at, RTAIL + at, R_HEADSLEEP + at, R_TAILSLEEP + at, R_DOORBELL + at,
                     RSTEP_W + at]] = [addr(words), addr(rc.head), addr(rc.tail), addr(rc.head_sleep),
                                       addr(rc.tail_sleep), addr(rc.doorbell), addr(rc.step_word)]
                row[PDESC + at] = addr(page.desc) if page is not None else 0  # a remote peer has no page
            for b, sc in enumerate(r.send):
                at = b * SB
                words = sc.words[proto] if proto != "Simple" else sc.buffs[proto]
                row[[SWORDS + at, SHEAD + at, STAIL + at, S_TAILSLEEP + at, S_HEADSLEEP + at, S_DOORBELL + at,
                     SSTEP_W + at]] = [addr(words), addr(sc.head), addr(sc.tail), addr(sc.tail_sleep),
                                       addr(sc.head_sleep), addr(sc.doorbell), addr(sc.step_word)]
                row[FIFO + at] = addr(sc.conn_fifo) if sc.conn_fifo is not None else 0  # proxied: tell the proxy
            if proto != "Simple":  # LL and LL128 go through a staging buffer each way (rings: one peer a side)
                nwords = max_bytes // 8
                row[[RSTAGE, SSTAGE]] = [addr(r.recv[0].staging(proto, nwords)), addr(r.send[0].staging(proto, nwords))]
            # NetRegMode marks a ring's NET receive (register.py registers rings only)
            self.rfifo.append(addr(r.recv[0].conn_fifo) if self.ring and r.recv[0].proxy_conn is not None else 0)
            row[FIRST], row[END] = first, first + len(prog)
            first += len(prog)
        ctl[[STEP_BYTES, FLAG_MOD, CLEAN_MASK, IS_FLOAT, NCH, MY_DESC, PROG, DESC_ROWS, DESC_COLS, SPC, SPS]] = [
            step_bytes, LL_FLAG_MOD, LL_CLEAN_MASK, dtype.kind == "f", len(self.rows), addr(my_page.desc),
            addr(self.prog), *my_page.desc.shape, spc, sps]
        ctl[LL128] = proto == "LL128"
        ctl[CANON] = np.array(CANONICAL_NAN.get(dtype.itemsize, 0), np.uint64).view(np.int64)

    def run(self, inp: np.ndarray, out: np.ndarray, sig: np.ndarray, waits: tuple) -> int:
        """Start the call and run it until done or blocked: the kernel publishes ``sig`` (and takes the op from it)
        and loads the step counters.  ``waits`` is ``WAITS``' policy, written to ``ctl`` when it changes: after
        ``max_idle`` idle rounds a blocked call with ``sleeps`` > 0 (more ranks than cores) yields ``yields`` times,
        then sleeps on what it waits for, up to ``sleeps`` times before it returns."""
        if waits is not self.waits:
            self.waits = waits
            self.ctl[MAX_IDLE], self.ctl[SLEEPS], self.ctl[YIELDS] = waits
        return self.kernel(self.ctl, inp, out, sig)  # the kernel copies sig into ctl: a numpy slice copy costs more here

    def net_reg(self, on: bool) -> None:
        """This call uses registered buffers (``register.py``): NetRegMode on each ring channel's NET peers
        (Simple)."""
        if on == self.registered:
            return
        self.registered = on
        for c, r in enumerate(self.rows):
            row = self.row(c)
            row[RREG] = self.rfifo[c] if on else 0
            row[SREG] = on and self.ring and r.send[0].proxy_conn is not None

    def resume(self, inp: np.ndarray, out: np.ndarray) -> int:
        return self.kernel(self.ctl, inp, out, self.ctl[:0])

    def row(self, c: int) -> np.ndarray:
        return self.ctl[HEADER + COLS * c:HEADER + COLS * (c + 1)]

    def mismatched_peer(self, c: int) -> int:
        """The receive peer of row ``c`` whose status page showed another call (``WAIT_MISMATCH``)."""
        return self.rows[c].recv[int(self.row(c)[WPEER])].peer

    def describe(self, c: int) -> tuple | None:
        """What row ``c`` waits for, as ``Kernel.waiting`` records it (None once it is done)."""
        row, r = self.row(c), self.rows[c]
        if row[PC] >= row[END]:
            return None
        prim = PRIMS[self.prog[row[PC], PRIM]]
        b = int(row[WPEER])
        if row[WAIT] == WAIT_HEAD:
            sc = r.send[b]
            return ("head", sc.peer, int(row[WSTEP]), sc.head, sc.head_sleep, prim)
        if row[WAIT] == WAIT_TAIL:
            rc = r.recv[b]
            return ("tail", rc.peer, int(row[WSTEP]), rc.tail, rc.tail_sleep, prim)
        rc = r.recv[0]
        return (f"{self.proto} flag", rc.peer, int(row[WSTEP]), rc.doorbell, rc.tail_sleep, prim)


class Cache:
    """A communicator's ``Compiled`` plans, by (plan, root, in-place, datatype)."""

    def __init__(self, channels: list, nranks: int, pages: dict, my_page, rank: int = 0):
        self.channels, self.nranks, self.pages, self.my_page = channels, nranks, pages, my_page
        self.plans: dict = {}
        if rank == 0:
            tree = ["Tree/Simple"] if enabled("Simple") and not all_reduce.tree_up_down() else []
            on = [f"Ring/{p}" for p in SWITCHES if enabled(p)] + tree
            off = [f"Ring/{p} ({SWITCHES[p]}=0)" for p in SWITCHES if not enabled(p)]
            listed = ", ".join(on[:-1]) + (" and " if len(on) > 1 else "") + (on[-1] if on else "")
            debug.info("INIT", (f"{listed} collectives run compiled (collectives/device/compiled.py)"
                                if on else "") + ("; " if on and off else "")
                       + (f"{', '.join(off)} run the readable primitives" if off else ""))

    def get(self, plan, run, root: int, in_place: bool, dtype: np.dtype, op: str, tracing: bool):
        """The compiled form of this call, or None when the readable path runs it (see ``eligible``)."""
        if not eligible(plan, dtype, op, tracing):
            return None
        key = (plan, root, in_place, dtype)
        got = self.plans.get(key)
        if got is None:
            if len(self.plans) > 1024:
                self.plans.clear()
            got = self.plans[key] = Compiled(plan, run, self.channels, self.nranks, root, in_place, np.dtype(dtype),
                                             self.pages, self.my_page)
        return got

    def free(self) -> None:
        """The communicator is destroyed: forget every compiled plan and the views of FIFOs, counters and status
        pages they keep (``keep``), so that their shared memory can be unmapped at once."""
        for compiled in self.plans.values():
            if compiled is not None:
                compiled.keep, compiled.rows = [], []
        self.plans, self.channels, self.pages, self.my_page = {}, [], {}, None


# More ranks than cores: a blocked call yields this many times, then sleeps on what it waits for (each sleep at
# most futex.SLEEP_NS), returning to Kernel.run (health checks, deadline) after this many sleeps.  Measured at n=8
# on 2 cores, 8 B AllReduce over LL (benchmarks/allreduce_vs_mpi.py): yields 0: 346-395 us, 30: 318-379, 300:
# 225-284, 1000: 103-286, 3000: 191-218; returning to Python after 2 idle rounds as before: 395-484.
YIELDS_BEFORE_SLEEP, SLEEPS_EACH = 1000, 50
# (max idle rounds, sleeps, yields) by (more ranks than cores, proxied connections).  A rank with proxied (NET)
# connections comes back to Kernel.run after 2 idle rounds, whose poll moves the proxy's bytes (after 4096, each
# NET hop of LL waited out the spin: docs/measured.md); it never waits inside.  With more ranks than cores and no
# proxy it waits inside (see above); otherwise it spins 4096 rounds, then lets Kernel.run wait.
WAITS = {(False, False): (4096, 0, 0), (True, False): (2, SLEEPS_EACH, YIELDS_BEFORE_SLEEP),
         (False, True): (2, 0, 0), (True, True): (2, 0, 0)}
# ... but with FEW_YIELDS_RANKS_PER_CORE ranks a core or more, a call moving FEW_YIELDS_FROM bytes or more sleeps
# after FEW_YIELDS yields.  A yield gives the core to a peer only if the scheduler finds one eligible (EEVDF: one
# that has not run ahead of its share), so a rank waiting on a peer that has used its share spins in yields while
# that peer waits for the core.  Measured at n = 8 on 2
# cores (3 policies in the same processes beside MPI's Allreduce, 7 alternating rounds, 2026-12-07,
# docs/measured.md), 1000 / 100 / 30 yields, us per call, in a run where ours ran as usual, then in one where the
# machine was in its slow state:
#   4 KiB    120 / 121 / 142      103 / 110 / 128
#   256 KiB  396 / 426 / 404      1159 / 993 / 1051
#   2 MiB    1494 / 1492 / 1505   5541 / 5238 / 4441
#   16 MiB   16057 / 11528 / 11745   51470 / 40227 / 31651
# At n = 4 and n = 3 (2 and 1.5 ranks a core) 30 yields were no better (256 KiB to 16 MiB within 4% in two runs of
# three, 16 MiB 6.6 against 5.0 ms in the third), so fewer yields only from 4 ranks a core, where they were measured.
FEW_YIELDS_FROM, FEW_YIELDS, FEW_YIELDS_RANKS_PER_CORE = 256 << 10, 30, 4
_FEW = (2, SLEEPS_EACH, FEW_YIELDS)


def waits_for(sleep: bool, proxied: bool, nbytes: int, ranks_per_core: float = 1.0) -> tuple:
    """The wait policy (``WAITS``) of a call whose larger buffer is ``nbytes`` long, ``ranks_per_core`` ranks
    sharing each core of this machine."""
    if sleep and not proxied and nbytes >= FEW_YIELDS_FROM and ranks_per_core >= FEW_YIELDS_RANKS_PER_CORE:
        return _FEW
    return WAITS[sleep, proxied]


def run(kernel, compiled: Compiled, inp: np.ndarray, out: np.ndarray, sig: np.ndarray) -> None:
    """The kernel for one compiled call.  Most calls end in the first try; a blocked one lets ``Kernel.run`` wait
    between tries (yield or sleep, check the peers and the deadline, write the hang report)."""
    waits = waits_for(kernel.sleep, kernel.poll is not None, max(inp.nbytes, out.nbytes), kernel.ranks_per_core)
    status = compiled.run(inp, out, sig, waits)
    if status != DONE:  # (after SLEEPS_EACH sleeps) yield at once, sleep after 30 rounds
        kernel.run([_resume(kernel, compiled, inp, out, status)], *((0, 30) if kernel.sleep else ()))


def _resume(kernel, compiled: Compiled, inp, out, status: int):
    """A kernel work item: record what each channel waits for, yield, try again."""
    ctl = compiled.ctl
    while True:
        if status == MISMATCH:  # the readable check raises, naming both calls
            c = next(c for c in range(len(compiled.rows)) if compiled.row(c)[WAIT] == WAIT_MISMATCH)
            kernel.check_peer_op(compiled.mismatched_peer(c))
        kernel.progress = int(ctl[MOVES])
        if not kernel.wait_state:  # Kernel.run clears it whenever progress moves: describe each stall once, not
            for c, r in enumerate(compiled.rows):  # every try (in Python, holding the GIL the proxy needs)
                what = compiled.describe(c)
                if what is not None:
                    kernel.wait_state[(r.channel.id, r.group)] = what
        yield
        status = compiled.resume(inp, out)
        if status == DONE:
            kernel.progress += 1
            return
