"""Rank programs for tests/test_overlap.py: ``overlap_workers.py NAME [args]``, one process per rank.

``refuse_and_place``: on every rank, each collective in both API forms with a receive buffer that partly overlaps
the send buffer (shifted by 1, 1,000 and 50,000 elements, either way, and AllGather's / ReduceScatter's
*other* rank's block) must be refused with one line before anything is enqueued; then the exact in-place form and
disjoint slices of one array must give NCCL's result bit for bit (integer-valued float32: every order of summation
gives the same bits, so the expected value is plain numpy).
"""
from __future__ import annotations

import sys

import numpy as np

import collectives

N = 100_000
SHIFTS = (1, 1000, 50_000)


def inputs(rank: int, count: int) -> np.ndarray:
    """This rank's input: small integers as float32, different on every rank."""
    return ((np.arange(count) * 7 + rank * 13) % 101).astype(np.float32)


def refused(what: str, call) -> None:
    try:
        call()
    except ValueError as exc:
        msg = str(exc)
        assert "overlap" in msg and "\n" not in msg, f"{what}: refused, but not in one line naming it: {msg!r}"
        return
    raise AssertionError(f"{what}: overlapping buffers were accepted")


def forms(comm, func: str, send: np.ndarray, recv: np.ndarray) -> list:
    """Both API forms of ``func`` on (send, recv): ours (``out=``) and nccl4py's (buffers first)."""
    if func == "AllReduce":
        return [lambda: comm.all_reduce(send, out=recv), lambda: comm.allreduce(send, recv, collectives.SUM)]
    if func == "AllGather":
        return [lambda: comm.all_gather(send, out=recv), lambda: comm.allgather(send, recv)]
    if func == "ReduceScatter":
        return [lambda: comm.reduce_scatter(send, out=recv), lambda: comm.reduce_scatter(send, recv, "sum")]
    if func == "Broadcast":
        return [lambda: comm.broadcast(send, root=0, out=recv), lambda: comm.broadcast(send, recv, 0)]
    return [lambda: comm.reduce(send, root=0, out=recv), lambda: comm.reduce(send, recv, collectives.SUM, 0)]


def refuse_and_place(args: list[str]) -> None:
    with collectives.Communicator() as comm:
        r, n = comm.rank, comm.nranks
        big = np.zeros(n * N + max(SHIFTS), np.float32)
        for func in ("AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce"):
            for k in SHIFTS:
                count_in = n * N if func == "ReduceScatter" else N  # a shift below N never lands on a block
                count_out = n * N if func == "AllGather" else N
                for direction, (s0, r0) in (("recv after send", (0, k)), ("recv before send", (k, 0))):
                    send, recv = big[s0:s0 + count_in], big[r0:r0 + count_out]
                    for i, call in enumerate(forms(comm, func, send, recv)):
                        refused(f"rank {r}: {func}, {direction} by {k}, form {i}", call)
        # AllGather / ReduceScatter: another rank's block is not in place
        other, c = (r + 1) % n, N
        refused(f"rank {r}: AllGather from block {other}", lambda: comm.all_gather(big[other * c:(other + 1) * c],
                                                                                   out=big[:n * c]))
        refused(f"rank {r}: ReduceScatter into block {other}",
                lambda: comm.reduce_scatter(big[:n * c], out=big[other * c:(other + 1) * c]))

        # exact in place, then disjoint slices of one array: bitwise right
        everyone = [inputs(q, N) for q in range(n)]
        total = np.sum(everyone, axis=0, dtype=np.float32)
        x = inputs(r, N)
        comm.all_reduce(x, out=x)
        assert np.array_equal(x, total), f"rank {r}: in-place AllReduce wrong"
        g = np.zeros(n * c, np.float32)
        g[r * c:(r + 1) * c] = inputs(r, c)
        comm.all_gather(g[r * c:(r + 1) * c], out=g)
        assert np.array_equal(g, np.concatenate([inputs(q, c) for q in range(n)])), \
            f"rank {r}: in-place AllGather wrong"
        x = inputs(r, n * c)
        comm.reduce_scatter(x, out=x[r * c:(r + 1) * c])
        want = np.sum([inputs(q, n * c) for q in range(n)], axis=0, dtype=np.float32)[r * c:(r + 1) * c]
        assert np.array_equal(x[r * c:(r + 1) * c], want), f"rank {r}: in-place ReduceScatter wrong"
        b = inputs(r, N)
        comm.broadcast(b, out=b, root=1)
        assert np.array_equal(b, inputs(1, N)), f"rank {r}: in-place Broadcast wrong"
        x = inputs(r, N)
        comm.reduce(x, out=x, root=0)
        assert r != 0 or np.array_equal(x, total), f"rank {r}: in-place Reduce wrong"

        one = np.zeros((n + 1) * N, np.float32)  # send and receive side by side in one array, sharing no byte
        one[:N] = inputs(r, N)
        comm.all_reduce(one[:N], out=one[N:2 * N])
        assert np.array_equal(one[N:2 * N], total) and np.array_equal(one[:N], inputs(r, N)), \
            f"rank {r}: AllReduce between disjoint slices wrong"
        comm.allgather(one[:c], one[N:N + n * c])
        assert np.array_equal(one[N:N + n * c], np.concatenate([inputs(q, c) for q in range(n)])), \
            f"rank {r}: AllGather between disjoint slices wrong"
    sys.stdout.write(f"rank {r} ok\n")
    sys.stdout.flush()


if __name__ == "__main__":
    globals()[sys.argv[1]](sys.argv[2:])
