"""Registered user buffers over NET (``ncclCommRegister``, NCCL's ``NCCL_NET_REG_BUFFER`` path of Ring/Simple
AllReduce, ``collectives/register.py``): the proxy sends from and receives into the user's buffers, the kernel
reduces in the output, and no NET FIFO slot is written.

* ``ring_algo.RingAR`` (NCCL's ``RingARAlgorithm``, which the proxy asks for each step's address) against the
  slices our ``run_ring`` actually moves, for many ring sizes, positions, counts and types;
* registered AllReduce over 4 emulated nodes (all NET), 2 x 2 (SHM inside a node) and NET/IB, compiled and
  readable, every op, odd counts, in and out of place, poisoned outputs: bitwise NCCL's order, NET FIFOs untouched;
* where NCCL would not use the registration (in place, avg, an unregistered send buffer, ``NCCL_LOCAL_REGISTER=0``, a
  deregistered buffer) the FIFOs carry the data and the bits are the same;
* over NET/IB, deregistering the last handle releases the buffer's memory regions on every connection;
* bad arguments get one line.
"""
import random
import re

import pytest

from collectives import enqueue, ring_algo
from collectives.device import all_reduce, compiled
from collectives.graph.rings import setup_ring
from conftest import run_ranks

IB = {"NCCL_NET": "IB", "NCCLLAB_TIMEOUT": "60"}


def _slices(rows, spc: int, min_slice: int):
    """What the kernel moves, per slice, for each recorded call: (send?, recv?, element offset, elements)."""
    for recv, send, src, dst, nelem, _, _ in rows:
        ix = src if src >= 0 else dst
        size = max(-(-nelem // (16 * spc)) * 16, min_slice)
        for s in range(spc):
            yield bool(send), bool(recv), ix + s * size, max(0, min(size, nelem - s * size)), src >= 0 and not recv


@pytest.mark.parametrize("nranks", [2, 3, 4, 5, 8])
def test_ring_algo_gives_the_addresses_run_ring_moves(nranks):
    rng = random.Random(nranks)
    for _ in range(25):
        esize = rng.choice([1, 2, 4, 8])
        chunk_steps, slice_steps = rng.choice([(4, 2), (2, 1), (8, 4), (1, 1)])
        step_bytes = rng.choice([512, 4096, 1 << 19])
        chunk_count = step_bytes * chunk_steps // esize
        part_offset, part_count = rng.randrange(0, 5000) * 16, rng.choice([1, 7, 1000, rng.randrange(1, 400_000)])
        work = enqueue.ChannelWork(0, part_offset, part_count, chunk_count, part_count)
        index = rng.randrange(nranks)
        ring = setup_ring(list(range(nranks)), index)
        spc = chunk_steps // slice_steps
        rows = compiled.record(lambda p, rg, w, n, root, ip: all_reduce.run_ring(p, rg, w, n), ring, work, nranks,
                               -1, False, esize, 1 << 40, spc)
        algo = ring_algo.RingAR(ring.index, nranks, chunk_steps, slice_steps, chunk_count * esize,
                                step_bytes * slice_steps, part_offset * esize, part_count * esize, esize)
        sent = recvd = 0
        min_slice = step_bytes // esize * slice_steps // 32
        for send, recv, off, n, from_input in _slices(rows, spc, min_slice):
            if send:
                which, at, size = algo.send_addr(sent * slice_steps)
                assert size == n * esize, (sent, size, n)
                if n:
                    assert (which, at) == ("send" if from_input else "recv", off * esize), (sent, which, at, off)
                else:  # getNextSendAddr: an empty slice at the send buffer's base
                    assert (which, at) == ("send", part_offset * esize), (sent, which, at)
                sent += 1
            if recv:
                which, at, size = algo.recv_addr(recvd * slice_steps)
                assert which == "recv" and size == n * esize, (recvd, size, n)
                if n:
                    assert at == off * esize, (recvd, at, off)
                recvd += 1
        assert sent == recvd == len(rows) * spc - (len(rows) // (2 * nranks - 1)) * spc


def _oks(proc) -> int:
    return len(re.findall(r"rank \d+ ok", proc.stdout))


def _case(nodes: int, **kw) -> str:
    import json
    return json.dumps({"counts": [1, 13, 4099, 65_537, 300_003], "dtypes": ["float32", "float64", "int8", "uint64"],
                       "ops": ["sum", "prod", "max", "min"], "channels": 2, **kw})


@pytest.mark.parametrize("nranks,nodes,env", [(4, 4, {}), (4, 2, {}), (3, 3, IB)], ids=["4x1", "2x2", "ib-3x1"])
def test_registered_allreduce_is_bitwise_and_leaves_the_net_fifos_alone(nranks, nodes, env):
    proc = run_ranks(nranks, "registered", _case(nodes), nodes=nodes, script="net_reg_workers.py",
                     env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "65536", **env}, timeout=300)
    assert _oks(proc) == nranks, proc.stdout


def test_where_nccl_would_not_use_the_registration_the_fifos_carry_it():
    proc = run_ranks(4, "fallbacks", _case(4, counts=[4099, 65_537], dtypes=["float32"]), nodes=4,
                     script="net_reg_workers.py",
                     env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "65536", "NCCL_DEBUG": "INFO",
                          "NCCL_DEBUG_SUBSYS": "REG"})
    assert _oks(proc) == 4, proc.stdout
    log = proc.stdout + proc.stderr
    assert "NCCL INFO register comm" in log and "NET register userbuff" in log, log[-3000:]


def test_the_tuner_takes_ring_for_registered_buffers_across_nodes():
    proc = run_ranks(4, "tuned", _case(4, counts=[(4 << 20) // 4 + 7, 65_537]), nodes=4, script="net_reg_workers.py",
                     timeout=300)
    assert _oks(proc) == 4, proc.stdout


def test_ib_deregister_releases_the_memory_regions():
    proc = run_ranks(2, "ib_deregister", _case(2, counts=[65_537]), nodes=2, script="net_reg_workers.py",
                     env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "65536", **IB})
    assert _oks(proc) == 2, proc.stdout


def test_local_register_off_skips_it():
    proc = run_ranks(2, "local_register_off", _case(2, counts=[65_537], dtypes=["float32"]), nodes=2,
                     script="net_reg_workers.py",
                     env={"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_LOCAL_REGISTER": "0", "NCCL_DEBUG": "INFO",
                          "NCCL_DEBUG_SUBSYS": "REG"})
    assert _oks(proc) == 2, proc.stdout
    assert "Skipping registration for buffer" in proc.stdout + proc.stderr


def test_bad_registrations_get_one_line():
    proc = run_ranks(2, "bad_arguments", script="net_reg_workers.py")
    assert _oks(proc) == 2, proc.stdout
