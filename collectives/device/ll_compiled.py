"""LL ring collectives in one compiled call: the same primitive calls as ``runRing<T, RedOp, ProtoLL>``
(NCCL ``src/device/all_reduce.h`` & co. over ``src/device/prims_ll.h``), executed by one numba function.

The readable path is the generator algorithms (``all_reduce.run_ring`` ...) over ``prims_ll.PrimitivesLL``.  This
module does not restate the algorithms: ``record`` runs the very same ``run_ring`` against a recorder and keeps the
list of primitive calls it makes (``send``, ``recv_reduce_send``, ...: offsets, element counts, recv/send), once
per plan.  ``run_ops`` then executes that list per channel, doing what ``PrimitivesLL.generic_op`` does for each
call: ``waitSend`` on head, ``readLL`` of every line of the recv slot until both flags of each line are the step's,
the reduction ``fn(local, peer)``, the store to the output, ``storeLL`` of every line with the step's flag (and
``incSend``'s cleanup on clean-mask steps, and ``connFifo`` for a proxied connection), then ``postRecv`` on head.
Same memory, flags, step counters and summation order, so results are bitwise the readable path's; the tests
(``tests/test_ll_compiled.py``) run both on the same inputs and compare bit patterns.

Everything ``run_ops`` touches is in one int64 control array (``ctl``: the parameters, this call's signature, and
per channel the addresses of its FIFOs, head, tail marks, staging and step counters plus where it stands), so a
call costs three arguments; the kernel maps the addresses with ``numba.carray``.

It runs when the plan is Ring/LL, nothing is traced (the trace needs the readable path's events), the type is one
numba computes natively (not float16/bfloat16) and the op is not avg; ``NCCLLAB_LL_COMPILED=0`` turns it off.  The
communicator says at INFO which one runs.  ``run_ops`` spins at most ``max_idle`` rounds without progress, then
returns what each channel waits for, so that the kernel's wait policy (yield, futex sleep, health checks, deadline,
hang report) stays the one in ``common.Kernel``.  With more ranks than cores it first waits itself, the way
``Kernel.run`` would (``sched_yield``, then the futex sleep on the same words and marks), and returns only every
``SLEEPS_EACH`` sleeps: a round trip through Python per try cost more than the hop it waited for.
User buffers that partly overlap never get here (``api.check_overlap`` refuses them); exact in-place calls agree.
Deliberate difference: NCCL has only the compiled kernel; this one exists because the Python primitives cost tens
of microseconds per call, which hides what LL is for (small-message latency).
"""
from __future__ import annotations

import numba
import numpy as np
from numba.extending import intrinsic

from collectives.include.device import LL_CLEAN_MASK, LL_FLAG_MOD, NCCL_STEPS
from collectives.misc import futex
from collectives.misc.param import env_int
from tracing import debug

from .reduce_copy import CANONICAL_NAN, OPS


# Columns of one recorded call.
REC, SND, SRC, DST, NELEM, FROM_OUT, PRIM = range(7)
# The control array: a header, then one row per channel (addresses first, then where the channel stands).
(STEP_BYTES, FLAG_MOD, CLEAN_MASK, OPCODE, MAX_IDLE, IS_FLOAT, NCH, MY_DESC, PROG, CANON, SIG) = range(11)
DESC_ROWS, DESC_COLS = SIG + 6, SIG + 7  # SIG takes 6 words: [opCount + 1, function, count, datatype, op, root]
SLEEPS, YIELDS = DESC_COLS + 1, DESC_COLS + 2  # oversubscribed: futex sleeps before returning, yields before one
HEADER = 20
(RWORDS, SWORDS, SHEAD, RHEAD, RSTAGE, SSTAGE, S_TAILSLEEP, S_DOORBELL, R_HEADSLEEP, FIFO, PDESC, RSTEP_W,
 SSTEP_W, FIRST, END, PC, LINES, RSTEP, SSTEP, CHECKED, WAIT, WSTEP, CREDIT, R_TAILSLEEP, R_DOORBELL,
 S_HEADSLEEP) = range(26)
COLS = 26
WAIT_HEAD, WAIT_FLAG, WAIT_MISMATCH = 1, 2, 3
DONE, BLOCKED, MISMATCH = 0, 1, 2
PRIMS = ["send", "send_from_output", "copy_send", "recv", "recv_reduce_send", "recv_reduce_copy",
         "recv_reduce_copy_send", "recv_copy_send"]
SUPPORTED = {np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.uint32, np.int64, np.uint64, np.float32,
                                   np.float64)}
# libc's syscall(2), resolved by name when numba links (a ctypes pointer would stop numba caching the kernel).
_syscall = numba.types.ExternalFunction("syscall", numba.int64(*[numba.int64] * 7))
_sched_yield = numba.types.ExternalFunction("sched_yield", numba.int32())
_SYS_FUTEX = futex.SYS_FUTEX if futex.SYS_FUTEX is not None else -1  # numba wants an int constant


def enabled() -> bool:
    return env_int("NCCLLAB_LL_COMPILED", 1) != 0


def eligible(plan, dtype: np.dtype, redop_name: str, tracing: bool) -> bool:
    """Whether a call runs here rather than through the readable primitives."""
    return (plan.proto == "LL" and plan.algo == "Ring" and not tracing and np.dtype(dtype) in SUPPORTED
            and (redop_name != "avg" or plan.func in ("AllGather", "Broadcast")) and enabled())


class _Recorder:
    """Stands in for a primitives object: each named primitive appends one row and moves nothing."""

    def __init__(self, esize: int, max_bytes: int):
        self.esize, self.max_bytes, self.rows = esize, max_bytes, []

    def _add(self, prim: str, recv: int, send: int, src, dst, nelem: int, from_output: int = 0):
        if nelem * self.esize > self.max_bytes:  # what PrimitivesLL.generic_op refuses; numba checks no bounds
            raise ValueError(f"LL call of {nelem * self.esize} B exceeds one step ({self.max_bytes} B)")
        self.rows.append((recv, send, -1 if src is None else src, -1 if dst is None else dst, max(nelem, 0),
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


def record(run, ring, work, nranks: int, root: int, in_place: bool, esize: int, max_bytes: int) -> np.ndarray:
    """The primitive calls that ``run`` (a function's ``runRing``, ``launch.RING``) makes for one channel's work,
    as rows of ``REC..PRIM``; ``max_bytes``: what one LL step carries."""
    rec = _Recorder(esize, max_bytes)
    for _ in run(rec, ring, work, nranks, root, in_place):
        pass
    return np.array(rec.rows, np.int64).reshape(-1, 7)


class Compiled:
    """One plan of one communicator, ready to run: the recorded calls of every channel and the memory they use."""

    def __init__(self, plan, run, channels: list, nranks: int, root: int, in_place: bool, dtype: np.dtype,
                 pages: dict, my_page):
        progs = [record(run, channels[w.channel].ring, w, nranks, root, in_place, dtype.itemsize,
                        channels[w.channel].recv.step_size("LL") // 2) for w in plan.works]
        self.prog = np.ascontiguousarray(np.concatenate(progs), np.int64)
        self.channels = [channels[w.channel] for w in plan.works]
        self.keep = [self.prog]  # everything whose address is in ctl stays alive as long as this object
        ctl = self.ctl = np.zeros(HEADER + COLS * len(self.channels), np.int64)
        addr = lambda a: self.keep.append(a) or futex.address(a)  # noqa: E731
        first = 0
        for c, (ch, prog) in enumerate(zip(self.channels, progs)):
            rc, sc = ch.recv, ch.send
            nwords = rc.step_size("LL") // 2 // 8
            page = pages.get(rc.peer)
            row = ctl[HEADER + COLS * c:HEADER + COLS * (c + 1)]
            row[[RWORDS, SWORDS, SHEAD, RHEAD, RSTAGE, SSTAGE, S_TAILSLEEP, S_DOORBELL, R_HEADSLEEP, RSTEP_W,
                 SSTEP_W]] = [addr(rc.words["LL"]), addr(sc.words["LL"]), addr(sc.head), addr(rc.head),
                              addr(rc.staging("LL", nwords)), addr(sc.staging("LL", nwords)), addr(sc.tail_sleep),
                              addr(sc.doorbell), addr(rc.head_sleep), addr(rc.step_word), addr(sc.step_word)]
            row[[R_TAILSLEEP, R_DOORBELL, S_HEADSLEEP]] = [addr(rc.tail_sleep), addr(rc.doorbell), addr(sc.head_sleep)]
            row[FIFO] = addr(sc.conn_fifo) if sc.conn_fifo is not None else 0  # proxied (NET): tell the proxy
            row[PDESC] = addr(page.desc) if page is not None else 0  # a remote peer has no page to compare
            row[FIRST], row[END] = first, first + len(prog)
            first += len(prog)
        ctl[[STEP_BYTES, FLAG_MOD, CLEAN_MASK, IS_FLOAT, NCH, MY_DESC, PROG, DESC_ROWS, DESC_COLS]] = [
            self.channels[0].recv.step_size("LL"), LL_FLAG_MOD, LL_CLEAN_MASK, dtype.kind == "f",
            len(self.channels), addr(my_page.desc), addr(self.prog), *my_page.desc.shape]
        ctl[CANON] = np.array(CANONICAL_NAN.get(dtype.itemsize, 0), np.uint64).view(np.int64)

    def run(self, inp: np.ndarray, out: np.ndarray, sig: np.ndarray, opcode: int, max_idle: int,
            sleeps: int = 0, yields: int = 0) -> int:
        """Start the call (publish ``sig``, load the step counters) and run it until done or blocked; ``sleeps``
        > 0 (more ranks than cores): a blocked call yields ``yields`` times, then sleeps on what it waits for, up
        to ``sleeps`` times before it returns."""
        ctl = self.ctl
        ctl[SIG:SIG + 6] = sig
        ctl[OPCODE], ctl[MAX_IDLE], ctl[SLEEPS], ctl[YIELDS] = opcode, max_idle, sleeps, yields
        return run_ops(ctl, inp, out, 1)

    def resume(self, inp: np.ndarray, out: np.ndarray) -> int:
        return run_ops(self.ctl, inp, out, 0)

    def row(self, c: int) -> np.ndarray:
        return self.ctl[HEADER + COLS * c:HEADER + COLS * (c + 1)]

    def progress(self) -> int:
        """Primitive calls done so far, over every channel (``Kernel.progress`` counts them)."""
        return sum(int(self.row(c)[PC] - self.row(c)[FIRST]) for c in range(len(self.channels)))

    def describe(self, c: int) -> tuple | None:
        """What channel ``c`` waits for, as ``Kernel.waiting`` records it (None once it is done)."""
        row, ch = self.row(c), self.channels[c]
        if row[PC] >= row[END]:
            return None
        prim = PRIMS[self.prog[row[PC], PRIM]]
        if row[WAIT] == WAIT_HEAD:
            return ("head", ch.send.peer, int(row[WSTEP]), ch.send.head, ch.send.head_sleep, prim)
        return ("LL flag", ch.recv.peer, int(row[WSTEP]), ch.recv.doorbell, ch.recv.tail_sleep, prim)


class Cache:
    """A communicator's ``Compiled`` plans, by (plan, root, in-place, datatype)."""

    def __init__(self, channels: list, nranks: int, pages: dict, my_page, rank: int = 0):
        self.channels, self.nranks, self.pages, self.my_page = channels, nranks, pages, my_page
        self.plans: dict = {}
        if rank == 0:
            debug.info("INIT", "LL ring collectives run compiled (collectives/device/ll_compiled.py)" if enabled()
                       else "LL ring collectives run the readable primitives (NCCLLAB_LL_COMPILED=0)")

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
                compiled.keep, compiled.channels = [], []
        self.plans, self.channels, self.pages, self.my_page = {}, [], {}, None


# More ranks than cores: a blocked call yields this many times, then sleeps on what it waits for (each sleep at
# most futex.SLEEP_NS), returning to Kernel.run (health checks, deadline) after this many sleeps.  Measured at n=8
# on 2 cores, 8 B AllReduce (benchmarks/allreduce_vs_mpi.py): yields 0: 346-395 us, 30: 318-379, 300: 225-284,
# 1000: 103-286, 3000: 191-218; returning to Python after 2 idle rounds as before: 395-484.
YIELDS_BEFORE_SLEEP, SLEEPS_EACH = 1000, 50


def run(kernel, compiled: Compiled, inp: np.ndarray, out: np.ndarray, op: str, sig: np.ndarray) -> None:
    """The kernel for one compiled call.  Most calls end in the first try; a blocked one lets ``Kernel.run`` wait
    between tries (yield or sleep, check the peers and the deadline, write the hang report)."""
    # A rank with proxied (NET) connections comes back to Kernel.run after 2 idle rounds, whose poll moves the
    # proxy's bytes (after 4096, each NET hop of LL waited out the spin: docs/measured.md);
    # it never waits inside either.  Otherwise, with more ranks than cores, it waits inside (see above).
    proxied = kernel.poll is not None
    waits = (SLEEPS_EACH, YIELDS_BEFORE_SLEEP) if kernel.sleep and not proxied else ()
    status = compiled.run(inp, out, sig, OPS[op], 2 if kernel.sleep or proxied else 4096, *waits)
    if status != DONE:  # (after SLEEPS_EACH sleeps) yield at once, sleep after 30 rounds
        kernel.run([_resume(kernel, compiled, inp, out, status)], *((0, 30) if kernel.sleep else ()))


def _resume(kernel, compiled: Compiled, inp, out, status: int):
    """A kernel work item: record what each channel waits for, yield, try again."""
    while True:
        if status == MISMATCH:  # the readable check raises, naming both calls
            c = next(c for c in range(len(compiled.channels)) if compiled.row(c)[WAIT] == WAIT_MISMATCH)
            kernel.check_peer_op(compiled.channels[c].recv.peer)
        kernel.progress = compiled.progress()
        for c, ch in enumerate(compiled.channels):
            what = compiled.describe(c)
            if what is not None:
                kernel.wait_state[(ch.id, 0)] = what
        yield
        status = compiled.resume(inp, out)
        if status == DONE:
            kernel.progress += 1
            return


@intrinsic
def _ptr(typingctx, addr):
    """An int64 address as a pointer, for ``numba.carray``."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(numba.types.voidptr))
    return numba.types.voidptr(numba.types.int64), codegen


@intrinsic
def _fence(typingctx):
    """A full memory fence (x86 ``mfence``): a store before it is visible before any load after it.  Sleeping
    needs it on both sides (Dekker): the poster stores its flag or head then loads the sleep mark; the sleeper
    stores the mark (``Kernel._arm``) then loads the flags again.  Without it x86 may let each load pass its own
    store, both miss, and the sleeper waits out its timeout."""
    def codegen(context, builder, signature, args):
        builder.fence("seq_cst")
        return context.get_dummy_value()
    return numba.types.none(), codegen


@numba.njit(nogil=True, cache=True)
def _wake(addr):
    _syscall(_SYS_FUTEX, addr, futex.FUTEX_WAKE, futex.WAKE_ALL, 0, 0, 0)


@numba.njit(nogil=True, cache=True)
def next_blocked(ctl, nch):
    """The first channel not done (what a blocked call sleeps on)."""
    for c in range(nch):
        st = ctl[HEADER + COLS * c:HEADER + COLS * (c + 1)]
        if st[PC] < st[END]:
            return c
    return 0


@numba.njit(nogil=True, cache=True)
def _wait_words(ctl, c):
    """(the word channel ``c`` sleeps on, its sleep mark): the reader's doorbell for LL flags, head for credit."""
    st = ctl[HEADER + COLS * c:HEADER + COLS * (c + 1)]
    if st[WAIT] == WAIT_HEAD:
        return st[SHEAD], st[S_HEADSLEEP]
    return st[R_DOORBELL], st[R_TAILSLEEP]


@numba.njit(nogil=True, cache=True)
def _arm(ctl, c):
    """``Kernel._arm``: remember the word's value, then mark its line sleeping; the caller looks once more."""
    word, mark = _wait_words(ctl, c)
    value = numba.carray(_ptr(word), 1, np.uint32)[0]
    numba.carray(_ptr(mark), 1, np.uint32)[0] = np.uint32(1)
    _fence()
    return np.int64(value)


@numba.njit(nogil=True, cache=True)
def _unarm(ctl, c):
    word, mark = _wait_words(ctl, c)
    numba.carray(_ptr(mark), 1, np.uint32)[0] = np.uint32(0)
    return -1


@numba.njit(nogil=True, cache=True)
def _sleep(ctl, c, value):
    """``futex.wait``: block while the word still holds ``value``, for at most ``futex.SLEEP_NS``."""
    word, _ = _wait_words(ctl, c)
    ts = np.empty(2, np.int64)
    ts[0], ts[1] = 0, futex.SLEEP_NS
    _syscall(_SYS_FUTEX, word, futex.FUTEX_WAIT, value, ts.ctypes.data, 0, 0)


@numba.njit(nogil=True, cache=True)
def _fn(a, b, opcode, is_float, canon):
    """``fn(local, peer)`` exactly as ``reduce_copy`` computes it (fmin/fmax for floats, canonical NaN)."""
    if opcode == 0:
        return a + b
    if opcode == 1:
        return a * b
    if is_float:
        if a != a and b != b:
            return canon
        if a != a:
            return b
        if b != b:
            return a
        if a == 0 and b == 0:  # +0 against -0: by sign in either order (reduce_copy.signed_zero)
            return a + b if opcode == 2 else -(-a - b)
    if opcode == 2:
        return a if a > b else b
    return a if a < b else b


@numba.njit(nogil=True, cache=True)
def run_ops(ctl, inp, out, starting):
    """Execute every channel's recorded calls, round-robin, until all are done (DONE), none has moved for
    ``MAX_IDLE`` rounds (BLOCKED: each channel's row says what it waits for), or a peer runs another call
    (MISMATCH).  ``starting``: publish the signature and load the step counters first."""
    step_bytes, flag_mod, clean_mask = ctl[STEP_BYTES], ctl[FLAG_MOD], ctl[CLEAN_MASK]
    opcode, max_idle, is_float, nch = ctl[OPCODE], ctl[MAX_IDLE], ctl[IS_FLOAT], ctl[NCH]
    words_per_slot, lines_per_slot = step_bytes // 8, step_bytes // 16
    esize = out.itemsize
    nwords = words_per_slot // 2
    low, sh = np.uint64(0xFFFFFFFF), np.uint64(32)
    canon = numba.carray(_ptr(ctl[CANON:].ctypes.data), 1, out.dtype)[0]
    sig = ctl[SIG:SIG + 6]
    prog = numba.carray(_ptr(ctl[PROG]), (ctl[HEADER + COLS * (nch - 1) + END], 7), np.int64)
    rows, cols = ctl[DESC_ROWS], ctl[DESC_COLS]  # the status pages' signature table (status.py)
    if starting:
        desc = numba.carray(_ptr(ctl[MY_DESC]), rows * cols, np.int64)
        row = (sig[0] - 1) % rows * cols  # publish this rank's call before any data moves
        for k in range(1, 6):
            desc[row + k] = sig[k]
        desc[row] = sig[0]
        for c in range(nch):
            st = ctl[HEADER + COLS * c:HEADER + COLS * (c + 1)]
            st[PC], st[LINES], st[WAIT], st[CREDIT], st[CHECKED] = st[FIRST], 0, 0, 0, st[PDESC] == 0
            st[RSTEP] = numba.carray(_ptr(st[RSTEP_W]), 1, np.int64)[0]
            st[SSTEP] = numba.carray(_ptr(st[SSTEP_W]), 1, np.int64)[0]
    _fence()  # a sleeper's mark, stored before this call, is visible before we look at the flags again
    idle, yields, sleeps, armed, armed_value = 0, 0, 0, -1, 0
    while True:
        remaining, moved = 0, False
        for c in range(nch):
            st = ctl[HEADER + COLS * c:HEADER + COLS * (c + 1)]
            if st[PC] >= st[END]:
                continue
            rwords = numba.carray(_ptr(st[RWORDS]), NCCL_STEPS * words_per_slot, np.uint64)
            swords = numba.carray(_ptr(st[SWORDS]), NCCL_STEPS * words_per_slot, np.uint64)
            shead = numba.carray(_ptr(st[SHEAD]), 1, np.uint64)
            rst = numba.carray(_ptr(st[RSTAGE]), nwords, np.uint64)
            sst = numba.carray(_ptr(st[SSTAGE]), nwords, np.uint64)
            rt = numba.carray(_ptr(st[RSTAGE]), nwords * 8 // esize, out.dtype)
            stt = numba.carray(_ptr(st[SSTAGE]), nwords * 8 // esize, out.dtype)
            while st[PC] < st[END]:
                op = prog[st[PC]]
                recv, send, src, dst, nelem, from_out = op[REC], op[SND], op[SRC], op[DST], op[NELEM], op[FROM_OUT]
                nbytes = nelem * esize
                nlines = (nbytes + 7) // 8
                if send and st[CREDIT] == 0:  # waitSend: at most NCCL_STEPS steps ahead of the reader
                    if shead[0] + np.uint64(NCCL_STEPS) < np.uint64(st[SSTEP] + 1):
                        st[WAIT], st[WSTEP] = WAIT_HEAD, st[SSTEP]
                        break
                    st[CREDIT] = 1
                if recv:  # readLL: every line carries the step's flag in both halves
                    step = st[RSTEP]
                    flag = np.uint64((step + 1) % flag_mod)
                    base = (step % NCCL_STEPS) * words_per_slot
                    i = st[LINES]
                    while i < nlines:
                        w0 = rwords[base + 2 * i]
                        w1 = rwords[base + 2 * i + 1]
                        if (w0 >> sh) != flag or (w1 >> sh) != flag:
                            break
                        rst[i] = (w0 & low) | (w1 << sh)
                        i += 1
                    st[LINES] = i
                    if i < nlines:
                        st[WAIT], st[WSTEP] = WAIT_FLAG, step
                        break
                    if nbytes > 0 and st[CHECKED] == 0:  # the peer's first data: is it running the same call?
                        pdesc = numba.carray(_ptr(st[PDESC]), rows * cols, np.int64)
                        prow = (sig[0] - 1) % rows * cols
                        for k in range(6):
                            if pdesc[prow + k] != sig[k]:
                                st[WAIT] = WAIT_MISMATCH
                                return MISMATCH
                        st[CHECKED] = 1
                # reduceCopy: acc = fn(local, peer) element by element, to the output and the send staging
                if send and nbytes % 8:
                    sst[nbytes // 8] = 0  # the padding of the last 8-byte unit goes out as zeros
                for e in range(nelem):
                    if src >= 0:
                        a = out[src + e] if from_out else inp[src + e]
                        v = _fn(a, rt[e], opcode, is_float, canon) if recv else a
                    else:
                        v = rt[e]
                    if dst >= 0:
                        out[dst + e] = v
                    if send:
                        stt[e] = v
                if send:  # storeLL, incSend's cleanup, then the reader's doorbell if it sleeps
                    step = st[SSTEP]
                    flag = np.uint64((step + 1) % flag_mod) << sh
                    base = (step % NCCL_STEPS) * words_per_slot
                    clean = (step & clean_mask) == clean_mask
                    if st[FIFO]:
                        fifo = numba.carray(_ptr(st[FIFO]), NCCL_STEPS, np.int64)
                        fifo[step % NCCL_STEPS] = step_bytes if clean else nlines * 16
                    for i in range(nlines):
                        v64 = sst[i]
                        swords[base + 2 * i] = (v64 & low) | flag
                        swords[base + 2 * i + 1] = (v64 >> sh) | flag
                    if clean:
                        for i in range(nlines, lines_per_slot):
                            swords[base + 2 * i] = flag
                            swords[base + 2 * i + 1] = flag
                    _fence()  # the flags are visible before we read whether the reader sleeps
                    if numba.carray(_ptr(st[S_TAILSLEEP]), 1, np.uint32)[0]:
                        numba.carray(_ptr(st[S_DOORBELL]), 1, np.uint32)[0] += np.uint32(1)
                        _wake(st[S_DOORBELL])
                    st[SSTEP] += 1
                if recv:  # postRecv: free the slot, wake the sender if it sleeps on head
                    st[RSTEP] += 1
                    numba.carray(_ptr(st[RHEAD]), 1, np.uint64)[0] = np.uint64(st[RSTEP])
                    _fence()
                    if numba.carray(_ptr(st[R_HEADSLEEP]), 1, np.uint32)[0]:
                        _wake(st[RHEAD])
                st[PC] += 1
                st[LINES] = 0
                st[CREDIT] = 0
                moved = True
            if st[PC] < st[END]:
                remaining += 1
            else:  # the primitives' destructor: save the step counters for the next collective
                numba.carray(_ptr(st[RSTEP_W]), 1, np.int64)[0] = st[RSTEP]
                numba.carray(_ptr(st[SSTEP_W]), 1, np.int64)[0] = st[SSTEP]
        if remaining == 0:
            if armed >= 0:
                _unarm(ctl, armed)
            return DONE
        if moved:
            idle, yields, sleeps = 0, 0, 0
            if armed >= 0:
                armed = _unarm(ctl, armed)
            continue
        idle += 1
        if idle < max_idle:
            continue
        # Blocked.  With more ranks than cores, wait here rather than in Python (a round trip through Kernel.run
        # per try costs more than a hop): yield the core a few times, then sleep on what the first blocked
        # channel waits for, as Kernel.run would (mark, look once more, futex wait, bounded).
        if ctl[SLEEPS] == 0 or (armed < 0 and sleeps >= ctl[SLEEPS]):
            return BLOCKED
        if armed >= 0:
            _sleep(ctl, armed, armed_value)
            armed = _unarm(ctl, armed)
            sleeps += 1
        elif yields < ctl[YIELDS]:
            yields += 1
            _sched_yield()
        else:
            armed = next_blocked(ctl, nch)
            armed_value = _arm(ctl, armed)
