"""Rank workers for tests/test_net_reg.py (registered user buffers over NET), run by conftest.run_ranks."""
from __future__ import annotations

import json
import os
import sys

import numpy as np

import collectives
from collectives.device import compiled as compiled_ring
from collectives.device.reduce_copy import DTYPES
from collectives.perf.colls import BY_CLI
from workers import independent_config, inputs_for, poisoned, rank0, same

POISON = 0xA5


def _net_fifos(comm) -> list[np.ndarray]:
    """The Simple FIFOs of every NET connector of the rings (the ones a registered call must not touch)."""
    return [c.buffs["Simple"] for ch in comm.channels for c in (ch.send, ch.recv) if c.proxy_conn is not None]


def _poison_fifos(comm, poison: int = POISON) -> None:
    for f in _net_fifos(comm):
        f[:] = poison


def _fifos_untouched(comm, poison: int = POISON) -> bool:
    return all(bool(np.all(f == poison)) for f in _net_fifos(comm))


def _one_call(comm, seed: int, dtype: str, op: str, count: int, in_place: bool, reg_send: bool = True,
              reg_recv: bool = True):
    """One AllReduce with fresh inputs and a poisoned output, registered as asked; checked bitwise against the
    reference.  Returns whether the NET FIFOs stayed untouched."""
    n, r = comm.nranks, comm.rank
    dt = DTYPES[dtype]
    xs = inputs_for(seed, n, count, dt)
    out = poisoned(count, dt)
    send = out if in_place else xs[r].copy()
    handles = []
    if reg_send:
        handles.append(comm.register(send))
    if reg_recv and not (in_place and reg_send):
        handles.append(comm.register(out))
    coll = BY_CLI["allreduce"]
    registered = comm.registered(send, out)  # regBuff, which the tuner plugin is told: the plan follows it
    want = coll.reference(xs, r, op, -1, **independent_config(comm, "AllReduce", count, dt, registered))
    # a few bytes of data can equal the poison by chance (CI once saw an int8 min of one element do so on two
    # ranks), so a payload that small is run again with the complement (no byte equals both): untouched means
    # untouched in both.  Every rank runs both calls: deciding from its own FIFOs made the ranks' call sequences
    # differ (CI: "collective mismatch ... count=1 ... count=13")
    untouched = True
    for poison in (POISON, 0xFF ^ POISON) if out.nbytes <= 64 else (POISON,):
        out[...] = poisoned(count, dt)  # every try starts from a poisoned output (in place: then the input)
        if in_place:
            send[...] = xs[r]
        _poison_fifos(comm, poison)
        got = comm.all_reduce(send, out=out, op=op)
        untouched = _fifos_untouched(comm, poison) and untouched
        same(got, want, f"rank {r}: registered AllReduce {dtype} {op} count={count} in_place={in_place} "
                        f"{compiled_ring.SWITCHES['Simple']}={os.environ.get(compiled_ring.SWITCHES['Simple'], '1')}")
    for h in handles:
        comm.deregister(h)
    return untouched


def _communicator(case: dict):
    """A communicator of ``case``'s search channels, told what the reference needs to know, and a fresh seed."""
    comm = collectives.Communicator(search_channels=case["channels"])
    comm._test_rings, comm._test_search_channels = None, case["channels"]  # for the reference's config
    return comm, rank0(comm, int.from_bytes(os.urandom(4), "little"))


def registered(args: list[str]) -> None:
    """Every type, op, count and placement, compiled then readable: bitwise, and no NET FIFO byte written."""
    case = json.loads(args[0])
    for mode in ("1", "0"):
        os.environ[compiled_ring.SWITCHES["Simple"]] = mode
        comm, seed = _communicator(case)
        with comm:
            assert _net_fifos(comm), f"rank {comm.rank}: no NET connection to test"
            for dtype in case["dtypes"]:
                for op in case["ops"]:
                    for count in case["counts"]:
                        for in_place in (False, True):
                            seed += 1
                            untouched = _one_call(comm, seed, dtype, op, count, in_place)
                            # in place NCCL does not use the registration (coll_reg.cc): the FIFOs carry it
                            assert untouched != in_place, (f"rank {comm.rank}: registered {dtype} {op} "
                                                           f"count={count} in_place={in_place} (compiled={mode}): "
                                                           f"NET FIFOs {'un' if untouched else ''}touched")
            ran = any(c is not None for t in comm._tasks.values() for c in t.compiled.values())
            assert ran == (mode == "1"), f"rank {comm.rank}: compiled={mode} but compiled forms ran: {ran}"
    print(f"rank {comm.rank} ok", flush=True)


def fallbacks(args: list[str]) -> None:
    """Where NCCL would not use the registration, the FIFOs carry the data; the bits are the same."""
    case = json.loads(args[0])
    comm, seed = _communicator(case)
    with comm:
        for count in case["counts"]:
            for dtype in case["dtypes"]:
                seed += 10
                assert _one_call(comm, seed, dtype, "sum", count, False)  # registered: the FIFOs stay as they were
                assert not _one_call(comm, seed + 1, dtype, "avg", count, False)  # SumPostDiv: never registered
                assert not _one_call(comm, seed + 2, dtype, "sum", count, False, reg_send=False)
                assert not _one_call(comm, seed + 3, dtype, "sum", count, False, reg_recv=False)
                assert not _one_call(comm, seed + 4, dtype, "sum", count, False, False, False)
                # registered, then deregistered: the next call with the same arrays is not registered
                dt = DTYPES[dtype]
                send, out = np.ones(count, dt), np.zeros(count, dt)
                h1, h2 = comm.register(send), comm.register(out)
                h3 = comm.register(out)  # twice: one more reference, still registered after one deregister
                comm.deregister(h1)
                comm.deregister(h2)
                h1 = comm.register(send)
                _poison_fifos(comm)
                comm.all_reduce(send, out=out)
                assert _fifos_untouched(comm) and np.all(out == comm.nranks)
                comm.deregister(h3)
                _poison_fifos(comm)
                comm.all_reduce(send, out=out)
                assert not _fifos_untouched(comm) and np.all(out == comm.nranks)
                comm.deregister(h1)
    print(f"rank {comm.rank} ok", flush=True)


def tuned(args: list[str]) -> None:
    """No algorithm forced: the cpu tuner's registered rule.  Across nodes an AllReduce of 2 MiB or more whose
    buffers are both registered plans Ring/Simple (the model alone: Tree/Simple), on one channel with more ranks than
    cores, and runs the registered path
    (no NET FIFO byte written), bitwise NCCL's ring order; in place it still plans Ring (NCCL's regBuff), through
    the FIFOs; below 2 MiB, or unregistered, the model's Tree/Simple.  The same two arrays passed again pick up a
    registration made, or dropped, between the calls."""
    case = json.loads(args[0])
    comm, seed = _communicator(case)
    big, small = case["counts"]
    with comm:
        f32 = np.dtype(np.float32)
        picks = {(c, reg): (comm.plan("AllReduce", c, f32, reg).algo, comm.plan("AllReduce", c, f32, reg).proto)
                 for c in (big, small) for reg in (False, True)}
        assert picks == {(big, False): ("Tree", "Simple"), (big, True): ("Ring", "Simple"),
                         (small, False): ("Tree", "Simple"), (small, True): ("Tree", "Simple")}, picks
        # and with more ranks than cores (this machine), the registered ring on one channel of the two (its nChannels)
        plan = comm.plan("AllReduce", big, f32, True)
        one = comm.nranks > len(os.sched_getaffinity(0))
        assert (plan.tuner_channels, plan.nchannels) == ((1, 1) if one else (0, 2)), \
            (plan.tuner_channels, plan.nchannels)
        assert _one_call(comm, seed, "float32", "sum", big, False), "registered 4 MiB: NET FIFOs touched"
        assert not _one_call(comm, seed + 1, "float32", "sum", big, False, False, False)
        assert not _one_call(comm, seed + 2, "float32", "sum", small, False)  # Tree: FIFOs, registered or not
        assert not _one_call(comm, seed + 3, "float32", "sum", big, True)  # in place: Ring, through the FIFOs
        send, out = np.ones(big, np.float32), np.zeros(big, np.float32)
        for step in ("unregistered", "registered", "deregistered"):
            handles = [comm.register(send), comm.register(out)] if step == "registered" else []
            _poison_fifos(comm)
            comm.all_reduce(send, out=out)
            ran = comm._checked.launch.task.plan.algo  # the launch api.all_reduce keeps for the same arrays
            assert ran == ("Ring" if step == "registered" else "Tree"), \
                f"rank {comm.rank}: the same arrays {step}: {ran}"
            assert _fifos_untouched(comm) == (step == "registered") and np.all(out == comm.nranks), \
                f"rank {comm.rank}: the same arrays {step}: NET FIFOs {'un' if _fifos_untouched(comm) else ''}touched"
            for h in handles:
                comm.deregister(h)
    print(f"rank {comm.rank} ok", flush=True)


def _ib_mrs_over(comm, array, sides: tuple = ("send", "recv")) -> list[int]:
    """For each NET connection of the rings on ``sides``, how many cached IB memory regions cover ``array``."""
    from collectives.misc.futex import address
    begin, end = address(array), address(array) + array.nbytes
    return [sum(e.start <= begin and end <= e.end for e in c.proxy_conn.comm.mrs.entries)
            for ch in comm.channels for c in [getattr(ch, side) for side in sides] if c.proxy_conn is not None]


def ib_deregister(args: list[str]) -> None:
    """NET/IB: a registered call registers the output on every NET connection and the input on each NET send;
    deregistering the last handle releases them (``ncclIbDeregMr``), one handle of two keeps them, and a new
    registration registers anew."""
    case = json.loads(args[0])
    comm, seed = _communicator(case)
    with comm:
        count = case["counts"][0]
        send, out = np.ones(count, np.float32), np.zeros(count, np.float32)
        assert _net_fifos(comm), f"rank {comm.rank}: no NET connection to test"
        for _ in range(2):  # the second time round: registered again after a full release
            assert not any(_ib_mrs_over(comm, send) + _ib_mrs_over(comm, out)), "an MR before registering"
            h_send, h_out, h_out2 = comm.register(send), comm.register(out), comm.register(out)
            _poison_fifos(comm)
            comm.all_reduce(send, out=out)
            assert _fifos_untouched(comm) and np.all(out == comm.nranks), f"rank {comm.rank}: not registered"
            # as ncclRegisterCollBuffers: a NET send connection registers both buffers (a ring step sends from
            # either), a NET receive connection only the output
            assert all(m == 1 for m in _ib_mrs_over(comm, send, ("send",)) + _ib_mrs_over(comm, out)), \
                (_ib_mrs_over(comm, send, ("send",)), _ib_mrs_over(comm, out))
            assert not any(_ib_mrs_over(comm, send, ("recv",))), \
                (f"rank {comm.rank}: the input registered on a NET receive", _ib_mrs_over(comm, send, ("recv",)))
            comm.deregister(h_out)  # one of out's two handles: its MRs stay
            assert all(m == 1 for m in _ib_mrs_over(comm, out)), _ib_mrs_over(comm, out)
            comm.deregister(h_out2)
            comm.deregister(h_send)
            assert not any(_ib_mrs_over(comm, send) + _ib_mrs_over(comm, out)), \
                (f"rank {comm.rank}: MRs left after deregister", _ib_mrs_over(comm, send), _ib_mrs_over(comm, out))
    print(f"rank {comm.rank} ok", flush=True)


def local_register_off(args: list[str]) -> None:
    """NCCL_LOCAL_REGISTER=0: register returns None, deregister(None) is fine, and the FIFOs carry the data."""
    case = json.loads(args[0])
    comm, seed = _communicator(case)
    with comm:
        assert comm.register(np.zeros(4, np.float32)) is None
        comm.deregister(None)
        assert not _one_call(comm, seed, "float32", "sum", case["counts"][0], False)
    print(f"rank {comm.rank} ok", flush=True)


def bad_arguments(args: list[str]) -> None:
    """One line each: a non-contiguous array, something that is not an array, an unknown or spent handle."""
    with collectives.Communicator() as comm:
        problems = []
        for call in (lambda: comm.register(np.zeros((4, 4), np.float32)[:, 1]),
                     lambda: comm.register(b"bytes"),
                     lambda: comm.deregister(object())):
            try:
                call()
                problems.append("accepted")
            except (TypeError, ValueError) as exc:
                assert "\n" not in str(exc), str(exc)
        h = comm.register(np.zeros(8, np.float32))
        comm.deregister(h)
        try:
            comm.deregister(h)
            problems.append("deregistered twice")
        except ValueError as exc:
            assert "could not find handle" in str(exc), str(exc)
        assert not problems, problems
    print(f"rank {comm.rank} ok", flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]](sys.argv[2:])
