"""Rank programs for the point-to-point tests: ``p2p_workers.py NAME [args]``, one process per rank."""
from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import collectives
from collectives.device.reduce_copy import DTYPES
from workers import inputs_for, poisoned, rank0, same


def p2p_schedule(args: list[str]) -> None:
    """Print this rank's ``Communicator.p2p_schedule()``."""
    with collectives.Communicator() as comm:
        sys.stdout.write(f"schedule {comm.rank} {comm.p2p_schedule()!r}\n")  # one write: ranks share the pipe
        sys.stdout.flush()


def pairs(args: list[str]) -> None:
    """pairs COUNTS DTYPES (JSON lists): for every (sender, receiver) pair in turn, self included, the sender's
    fresh random input arrives bitwise in the receiver's poisoned buffer; ranks outside the pair do nothing."""
    counts, dtypes = json.loads(args[0]), json.loads(args[1])
    with collectives.Communicator() as comm:
        n, r = comm.nranks, comm.rank
        seed = rank0(comm, int.from_bytes(os.urandom(4), "little"))
        moved = 0
        for dtype in dtypes:
            dt = DTYPES[dtype]
            for count in counts:
                for src in range(n):
                    for dst in range(n):
                        seed += 1
                        if r not in (src, dst):
                            continue
                        x = inputs_for(seed, n, count, dt)[src]
                        out = poisoned(count, dt)
                        if src == dst:  # a self-send: both halves in one group
                            with collectives.group():
                                comm.send(x, dst)
                                comm.recv(out, src)
                        elif r == src:
                            comm.send(x, dst)
                        else:
                            comm.recv(out, src)
                        if r == dst:
                            same(out, x, f"{dtype} count={count} {src}->{dst} n={n}")
                            moved += 1
        sys.stdout.write(f"rank {r} ok {moved} receives\n")
        sys.stdout.flush()


def ring(args: list[str]) -> None:
    """ring COUNT DTYPE: in one group each rank sends to rank + 1 and receives from rank - 1 (group_start /
    group_end), then the same with the context manager in the other direction."""
    count, dt = int(args[0]), DTYPES[args[1]]
    with collectives.Communicator() as comm:
        n, r = comm.nranks, comm.rank
        seed = rank0(comm, int.from_bytes(os.urandom(4), "little"))
        xs = inputs_for(seed, n, count, dt)
        out = poisoned(count, dt)
        collectives.group_start()
        comm.send(xs[r], (r + 1) % n)
        comm.recv(out, (r - 1) % n)
        collectives.group_end()
        same(out, xs[(r - 1) % n], f"ring +1 count={count} rank {r}")
        back = poisoned(count, dt)
        with collectives.group():
            comm.recv(back, (r + 1) % n)
            comm.send(xs[r], (r - 1) % n)
        same(back, xs[(r + 1) % n], f"ring -1 count={count} rank {r}")
        sys.stdout.write(f"rank {r} ok ring\n")
        sys.stdout.flush()


def unmatched(args: list[str]) -> None:
    """Rank 0 sends to rank 1, which never posts the matching recv and destroys its communicator.  ``first``: at
    their first exchange (the connection fails); ``connected``: after one that connected them, with more than
    the FIFO holds (the kernel waits for credit); ``busy``: rank 1 stays alive past the deadline first, so rank 0's
    wait ends by its deadline, not by learning that rank 1 left."""
    with collectives.Communicator() as comm:
        if args[0] == "busy" and comm.rank == 1:
            time.sleep(2 * float(os.environ["NCCLLAB_TIMEOUT"]))
        big = np.arange(1 << 20, dtype=np.float32)  # 4 MiB: more than NCCL_STEPS chunks of 128 KiB
        if args[0] == "connected":
            if comm.rank == 0:
                comm.send(big, 1)
            else:
                comm.recv(np.empty_like(big), 0)
        if comm.rank == 0:
            comm.send(big if args[0] == "connected" else big[:1000], 1)


def alltoall(args: list[str]) -> None:
    """alltoall COUNTS DTYPES (JSON lists): block q of every rank's result is rank q's block for it, bitwise, in
    both forms (ours with a fresh result, nccl4py's into a poisoned buffer)."""
    counts, dtypes = json.loads(args[0]), json.loads(args[1])
    with collectives.Communicator() as comm:
        n, r = comm.nranks, comm.rank
        seed = rank0(comm, int.from_bytes(os.urandom(4), "little"))
        for dtype in dtypes:
            dt = DTYPES[dtype]
            for count in counts:
                seed += 1
                xs = inputs_for(seed, n, count * n, dt)
                want = np.concatenate([xs[q][r * count:(r + 1) * count] for q in range(n)])
                same(comm.all_to_all(xs[r]), want, f"all_to_all {dtype} count={count} rank {r}")
                out = poisoned(count * n, dt)
                comm.alltoall(xs[r], out)
                same(out, want, f"alltoall {dtype} count={count} rank {r}")
        sys.stdout.write(f"rank {r} ok alltoall\n")
        sys.stdout.flush()


def usage(args: list[str]) -> None:
    """What NCCL refuses as invalid usage, refused here before anything moves; the communicator stays usable."""
    with collectives.Communicator() as comm:
        r, n = comm.rank, comm.nranks
        x = np.arange(5, dtype=np.float32) + r
        for bad, why in ((lambda: comm.send(x, n), "out of range"), (lambda: comm.recv(x[::2], 0), "contiguous"),
                         (lambda: comm.send([1, 2], 0), "numpy array")):
            try:
                bad()
            except (ValueError, TypeError) as exc:
                assert why in str(exc), exc
            else:
                raise AssertionError(f"accepted: {why}")
        y = np.zeros(2 * n, np.float32)
        try:
            comm.all_to_all(y, out=y)
        except ValueError as exc:
            assert "no in-place form" in str(exc), exc
        else:
            raise AssertionError("an in-place all_to_all was accepted")
        if n > 1:
            try:
                comm.all_to_all(np.zeros(2 * n + 1, np.float32))
            except ValueError as exc:
                assert "not a multiple of nranks" in str(exc), exc
            else:
                raise AssertionError("an all_to_all of a size not a multiple of nranks was accepted")
        try:  # a send to oneself needs its recv in the same group
            comm.send(x, r)
        except ValueError as exc:
            assert "without a matching recv" in str(exc), exc
        else:
            raise AssertionError("a lone send to oneself was accepted")
        try:  # a bad collective in a group raises at its call, and the group's other work is dropped
            with collectives.group():
                comm.send(x, (r + 1) % n)
                comm.all_reduce(x, op="nope")
        except ValueError as exc:
            assert "nope" in str(exc), exc
        else:
            raise AssertionError("a bad op inside a group was accepted")
        try:
            collectives.group_end()
        except RuntimeError as exc:
            assert "without a matching group_start" in str(exc), exc
        with collectives.group():  # in place to oneself: nothing moves, nothing breaks
            comm.send(x, r)
            comm.recv(x, r)
        assert np.array_equal(x, np.arange(5, dtype=np.float32) + r)
        with collectives.group():  # nested groups launch at the outermost end
            collectives.group_start()
            out = np.zeros(5, np.float32)
            comm.send(x, (r + 1) % n)
            comm.recv(out, (r - 1) % n)
            collectives.group_end()
            assert not out.any()  # not launched yet
        assert np.array_equal(out, np.arange(5, dtype=np.float32) + (r - 1) % n)
        assert np.array_equal(comm.all_reduce(x), sum(np.arange(5, dtype=np.float32) + q for q in range(n)))
        sys.stdout.write(f"rank {r} ok usage\n")
        sys.stdout.flush()


def rooted(args: list[str]) -> None:
    """rooted COUNTS DTYPES (JSON lists): gather and scatter at every root, bitwise, in both forms (ours with a
    fresh result, nccl4py's into poisoned buffers), out of place and in place; a non-root rank's gather recvbuf
    and scatter sendbuf stay as they were, bytes and all."""
    counts, dtypes = json.loads(args[0]), json.loads(args[1])
    with collectives.Communicator() as comm:
        n, r = comm.nranks, comm.rank
        seed = rank0(comm, int.from_bytes(os.urandom(4), "little"))
        for dtype in dtypes:
            dt = DTYPES[dtype]
            for count in counts:
                for root in range(n):
                    seed += 1
                    what = f"{dtype} count={count} root={root} rank {r} n={n}"
                    xs = inputs_for(seed, n, count, dt)
                    gathered = np.concatenate(xs)
                    # gather, ours: the root's result is every rank's input in rank order; zeros elsewhere
                    got = comm.gather(xs[r], root)
                    same(got, gathered if r == root else np.zeros(n * count, dt), f"gather {what}")
                    # gather, nccl4py's: into a poisoned buffer; a non-root's buffer is never touched
                    out = poisoned(n * count, dt)
                    comm.gather(xs[r], out, root)
                    same(out, gathered if r == root else poisoned(n * count, dt), f"nccl4py gather {what}")
                    comm.gather(xs[r], None if r != root else out, root=root)  # nccl4py: recvbuf None off the root
                    if r == root:
                        same(out, gathered, f"nccl4py gather recvbuf=None elsewhere {what}")
                    # gather in place on the root: sendbuff == recvbuff + root * count
                    out = poisoned(n * count, dt)
                    if r == root:
                        out[root * count:(root + 1) * count] = xs[r]
                        comm.gather(out[root * count:(root + 1) * count], out, root)
                        same(out, gathered, f"in-place gather {what}")
                    else:
                        comm.gather(xs[r], out, root)
                        same(out, poisoned(n * count, dt), f"in-place gather, non-root buffer {what}")
                    # scatter, ours: every rank passes nranks * count elements, only the root's are read
                    big = inputs_for(seed + 10 ** 6, n, n * count, dt)
                    src = big[root] if r == root else poisoned(n * count, dt)
                    mine = big[root][r * count:(r + 1) * count]
                    same(comm.scatter(src, root), mine, f"scatter {what}")
                    same(src, big[root] if r == root else poisoned(n * count, dt), f"scatter's send kept {what}")
                    if count:  # nccl4py refuses a send buffer of fewer than nranks elements
                        out = poisoned(count, dt)
                        comm.scatter(big[root] if r == root else None, out, root)
                        same(out, mine, f"nccl4py scatter {what}")
                        # scatter in place on the root: recvbuff == sendbuff + root * count
                        buf = big[root].copy()
                        recv = buf[root * count:(root + 1) * count] if r == root else poisoned(count, dt)
                        comm.scatter(buf if r == root else None, recv, root)
                        same(recv, mine, f"in-place scatter {what}")
                        if r == root:
                            same(buf, big[root], f"in-place scatter's send {what}")
        sys.stdout.write(f"rank {r} ok rooted\n")
        sys.stdout.flush()


def rooted_usage(args: list[str]) -> None:
    """gather / scatter arguments NCCL or nccl4py refuse, refused here on every rank before anything moves; the
    nccl4py gather without a root is an AllGather; the communicator stays usable."""
    with collectives.Communicator() as comm:
        r, n = comm.rank, comm.nranks
        x = np.arange(6 * n, dtype=np.float32) + r
        y = np.zeros(6 * n * n + 1, np.float32)  # buffers that overlap without being in place
        bad = [(lambda: comm.gather(x, n), "out of range"), (lambda: comm.scatter(x, -1), "out of range"),
               (lambda: comm.gather(x, root=0, out=np.zeros(6 * n, np.int32)) if r == 0 else
                comm.gather(x, 0, 1), "dtype" if r == 0 else "too many"),
               (lambda: comm.scatter(x, np.zeros(6, np.float32)), "root is required"),
               (lambda: comm.scatter(x, np.zeros(7, np.float32), 0) if r == 0 else
                comm.scatter(x, np.zeros(7, np.float32), root=1, out=x), "exactly 6" if r == 0 else "twice"),
               (lambda: comm.scatter(x[:n - 1], np.zeros(1, np.float32), r), f"at least {n}"),
               (lambda: comm.gather(y[1:6 * n + 1], out=y[:6 * n * n], root=r), "not in place"),
               (lambda: comm.scatter(y[:6 * n], out=y[1:7], root=r), "not in place")]
        if n > 1:
            bad.append((lambda: comm.scatter(np.zeros(2 * n + 1, np.float32)), "not a multiple of nranks"))
        for call, why in bad:
            try:
                call()
            except (ValueError, TypeError) as exc:
                assert why in str(exc), (why, exc)
            else:
                raise AssertionError(f"accepted: {why}")
        out = poisoned(6 * n * n, np.float32)
        comm.gather(x, out)  # nccl4py without a root: an AllGather on every rank
        same(out, np.concatenate([np.arange(6 * n, dtype=np.float32) + q for q in range(n)]), "gather, no root")
        with collectives.group():  # a gather inside the caller's group launches at its end
            got = comm.gather(x, n - 1)
        same(got, out if r == n - 1 else np.zeros(6 * n * n, np.float32), "gather in a group")
        sys.stdout.write(f"rank {r} ok rooted_usage\n")
        sys.stdout.flush()


def _child_round(child, seed: int, count: int, where: str, hold_group_s: float = 0.0) -> None:
    """One round on a split child: an AllReduce bitwise against the reference on the child's own rings, then a ring
    exchange (send to the next child rank, receive from the previous) in one group, held open ``hold_group_s``."""
    from collectives.perf.reference import all_reduce as reference_all_reduce
    xs = inputs_for(seed, child.nranks, count, np.float32)
    got = child.all_reduce(xs[child.rank])
    want = reference_all_reduce(xs, "sum", **child.reference_config("AllReduce", count, np.float32))
    same(got, want, f"child all_reduce count={count} {where}")
    out = poisoned(count, np.float32)
    with collectives.group():
        child.send(xs[child.rank], (child.rank + 1) % child.nranks)
        time.sleep(hold_group_s)
        child.recv(out, (child.rank - 1) % child.nranks)
    same(out, xs[(child.rank - 1) % child.nranks], f"child ring count={count} {where}")


def split(args: list[str]) -> None:
    """split at n=4: two colors with keys reversing the order and one rank with None, then one color of three
    ranks reversed and one None; each child runs an AllReduce (bitwise against the reference on its own rings),
    sends and receives, and is destroyed; the parent stays usable in between and after."""
    with collectives.Communicator() as comm:
        n, r = comm.nranks, comm.rank
        assert n == 4
        seed = rank0(comm, int.from_bytes(os.urandom(4), "little"))
        from collectives import bootstrap
        for colors, keys in (([1, 0, 1, None], [10, 0, 5, 0]), ([4, 4, 4, None], [-0, -1, -2, 0])):
            roots = set(bootstrap._roots) | set(bootstrap._listeners)
            child = comm.split(colors[r], keys[r])
            # bootstrapSplit: the child's ring came through the parent's, no root was opened for it
            assert set(bootstrap._roots) | set(bootstrap._listeners) == roots, "the split opened a bootstrap root"
            if child is not None:
                assert child.bootstrap.uid.port == 0 and type(child.bootstrap).__name__ == "SplitBootstrap"
            if colors[r] is None:
                assert child is None
            else:
                members = sorted((keys[q], q) for q in range(n) if colors[q] == colors[r])
                order = [q for _, q in members]
                assert (child.nranks, child.rank) == (len(order), order.index(r)), (order, child.rank)
                for count in (1, 4097, 70001):
                    seed += 1
                    _child_round(child, seed, count, f"colors={colors} rank {r}")
            x = np.arange(1000, dtype=np.float32) * (r + 1)
            same(comm.all_reduce(x), sum(np.arange(1000, dtype=np.float32) * (q + 1) for q in range(n)),
                 f"parent after split, rank {r}")
            if child is not None:
                child.destroy()
        try:
            comm.split(-2, 0)
        except ValueError as exc:
            assert "non-negative" in str(exc), exc
        else:
            raise AssertionError("a negative color was accepted")
        got = comm.gather(np.full(3, r, np.int32), 0)
        if r == 0:
            same(got, np.repeat(np.arange(n, dtype=np.int32), 3), "parent gather after the children")
        sys.stdout.write(f"rank {r} ok split\n")
        sys.stdout.flush()


def group_colls(args: list[str]) -> None:
    """Eight AllReduces alone, then in one group: small odd counts of random floats (NCCL's rules give each the
    same channel part and one loop, alone or grouped, so even floats agree bitwise; also checked against the
    reference), and larger ones of integer-valued floats that the group spreads over the channels (exact sums:
    any order agrees).  Then a mixed group: an AllReduce, a ring send/recv and an AllGather, one plan."""
    from collectives.perf.reference import all_reduce as reference_all_reduce
    with collectives.Communicator() as comm:
        n, r = comm.nranks, comm.rank
        seed = rank0(comm, int.from_bytes(os.urandom(4), "little"))
        small = [1, 7, 100, 333, 1000, 513, 64, 999]
        xs = [inputs_for(seed + i, n, c, np.float32) for i, c in enumerate(small)]
        big = [100003, 70001, 1 << 16, 5, 200000, 4097, 30000, 65536]
        ys = [[np.random.default_rng([seed, i, q]).integers(-999, 999, c).astype(np.float32) for q in range(n)]
              for i, c in enumerate(big)]
        alone = [comm.all_reduce(x[r]) for x in xs]
        alone_big = [comm.all_reduce(y[r]) for y in ys]
        for i, c in enumerate(small):
            same(alone[i], reference_all_reduce(xs[i], "sum", **comm.reference_config("AllReduce", c, np.float32)),
                 f"alone count={c}")
        for outs, inputs, want in ((small, xs, alone), (big, ys, alone_big)):
            got = [poisoned(c, np.float32) for c in outs]
            with collectives.group():
                for i, x in enumerate(inputs):
                    comm.all_reduce(x[r], out=got[i])
                assert all(np.isnan(g).all() for g in got), "ran before the group's end"
            for i, c in enumerate(outs):
                same(got[i], want[i], f"grouped AllReduce {i} count={c} rank {r}")
        for i, c in enumerate(big):
            same(alone_big[i], np.sum(np.array(ys[i], np.int64), 0).astype(np.float32), f"exact count={c}")
        x, y = xs[4], inputs_for(seed + 99, n, 4097, np.int32)
        ring_out, gathered = poisoned(4097, np.int32), poisoned(5 * n, np.float32)
        with collectives.group():
            reduced = comm.all_reduce(x[r])
            comm.send(y[r], (r + 1) % n)
            comm.recv(ring_out, (r - 1) % n)
            comm.all_gather(xs[1][r][:5], out=gathered)
        same(reduced, alone[4], f"mixed AllReduce rank {r}")
        same(ring_out, y[(r - 1) % n], f"mixed ring recv rank {r}")
        same(gathered, np.concatenate([xs[1][q][:5] for q in range(n)]), f"mixed AllGather rank {r}")
        sys.stdout.write(f"rank {r} ok group_colls\n")
        sys.stdout.flush()


def simulate(args: list[str]) -> None:
    """group_end(simulate=True) against ncclTopoGetAlgoTime written again here over the cost model's own tables:
    eight AllReduces of 1000 floats (one aggregate of 8 x 4000 bytes, numPipeOps = ceil(8 / nChannels)); one of
    1000 and one of 100 000 (not within 4x: two choices, the larger one last); p2p only (-1, nothing estimated).
    Nothing runs: the output stays poisoned, and the next real group works."""
    from collectives.graph.cost_model import MAX_DEV_WORK_BATCH_COLLS, TREE_CORRECTION
    with collectives.Communicator() as comm:
        n, r, cm = comm.nranks, comm.rank, comm.cost_model

        def expected(nbytes: int, pipe: int) -> float:
            best = None
            for a in (0, 1):  # Tree, Ring
                for p in range(3):
                    bw, lat = float(cm.bw["AllReduce"][a][p]), float(cm.lat["AllReduce"][a][p])
                    if bw == 0:
                        continue
                    log_size = (nbytes >> 6).bit_length() - 1
                    if a == 0 and 0 <= log_size < 23:
                        bw *= TREE_CORRECTION[p][log_size]
                    count = pipe if a == 1 else -(-pipe // MAX_DEV_WORK_BATCH_COLLS)
                    t = lat * count + nbytes / (1000 * bw)
                    best = t if best is None or t < best else best
            return best

        x = np.ones(1000, np.float32)
        outs = [poisoned(1000, np.float32) for _ in range(8)]
        collectives.group_start()
        for out in outs:
            comm.all_reduce(x, out=out)
        info = collectives.group_end(simulate=True)
        want = expected(8 * 4000, -(-8 // comm.nchannels))
        assert abs(info.estimated_time - want) <= 1e-5 * want, (info, want)
        assert all(np.isnan(o).all() for o in outs), "a simulated group ran"
        collectives.group_start()
        comm.all_reduce(x)
        comm.all_reduce(np.ones(100000, np.float32))
        info2 = collectives.group_end(simulate=True)
        want2 = expected(400000, -(-2 // comm.nchannels))
        assert abs(info2.estimated_time - want2) <= 1e-5 * want2, (info2, want2)
        collectives.group_start()
        comm.send(x, (r + 1) % n)
        comm.recv(outs[0], (r - 1) % n)
        assert collectives.group_end(simulate=True).estimated_time == -1.0
        assert np.isnan(outs[0]).all()
        with collectives.group():
            comm.all_reduce(x, out=outs[1])
        same(outs[1], np.full(1000, n, np.float32), "after the simulations")
        sys.stdout.write(f"rank {r} ok simulate {info.estimated_time:.3f} {info2.estimated_time:.3f}\n")
        sys.stdout.flush()


def named(args: list[str]) -> None:
    """The p2p failures NCCL users meet most, each between rank 0 and rank 1 after one exchange connected them:
    ``bigger_send`` (rank 0 sends 4 MiB, rank 1 receives 1 MiB, then both call AllReduce), ``smaller_send`` (the
    other way round), ``split`` (rank 0 groups two sends of 4 MiB, rank 1 receives the first alone, then calls
    AllReduce before the second), ``left`` (rank 1 exits instead of receiving)."""
    mode = args[0]
    with collectives.Communicator() as comm:
        r = comm.rank
        big, small = np.ones(1 << 20, np.float32), np.ones(1 << 18, np.float32)  # 4 MiB and 1 MiB
        if r == 0:
            comm.send(small, 1)
        elif r == 1:
            comm.recv(np.empty_like(small), 0)
        if mode == "left" and r == 1:
            os._exit(0)
        if r == 0:
            if mode == "split":
                with collectives.group():
                    comm.send(big, 1)
                    comm.send(big, 1)
            else:
                comm.send(small if mode == "smaller_send" else big, 1)
        elif r == 1:
            comm.recv(np.empty_like(big if mode == "smaller_send" else small), 0)
        comm.all_reduce(small)


def group_vs_alone(args: list[str]) -> None:
    """Rank 0 groups two AllReduces, the others make them one by one: a mismatch, named at once."""
    with collectives.Communicator() as comm:
        x = np.ones(100000, np.float32)
        if comm.rank == 0:
            with collectives.group():
                comm.all_reduce(x)
                comm.all_reduce(x)
        else:
            comm.all_reduce(x)
            comm.all_reduce(x)


def coverage(args: list[str]) -> None:
    """One run for one configuration (n = 8, NET/IB): every send/recv pair, all-to-all, gather and scatter at every
    root, and the grouped collectives, each worker above on a communicator of its own, fewer sizes."""
    pairs([json.dumps([0, 7, 70001]), json.dumps(["float32"])])
    alltoall([json.dumps([1, 4097]), json.dumps(["float32"])])
    rooted([json.dumps([7, 4097]), json.dumps(["int32"])])
    group_colls([])


def split_concurrent(args: list[str]) -> None:
    """split at n=4 into two colors (even and odd ranks); each child runs AllReduces and a grouped ring exchange in
    its own thread while the parent runs AllReduces and an all-to-all in the main thread, at the same time (NCCL's
    group state is per thread, so the parent's calls never join the child's group).  Everything bitwise."""
    import threading
    from collectives.perf.reference import all_reduce as reference_all_reduce
    with collectives.Communicator() as comm:
        n, r = comm.nranks, comm.rank
        seed = rank0(comm, int.from_bytes(os.urandom(4), "little"))
        child = comm.split(r % 2, r)
        failures = []

        def child_work() -> None:
            try:
                for i, count in enumerate((4097, 70001, 1)):
                    # the group stays open a while, as the parent's thread makes its calls
                    _child_round(child, seed + 100 + i, count, f"rank {r}", hold_group_s=0.1)
            except BaseException as exc:  # noqa: BLE001  reported by the main thread
                failures.append(exc)

        thread = threading.Thread(target=child_work, name=f"child-of-rank-{r}")
        thread.start()
        for i, count in enumerate((70001, 1, 4097) * 2):
            xs = inputs_for(seed + i, n, count, np.float32)
            got = comm.all_reduce(xs[r])
            want = reference_all_reduce(xs, "sum", **comm.reference_config("AllReduce", count, np.float32))
            same(got, want, f"parent all_reduce count={count} rank {r}")
            blocks = [np.arange(n * 5, dtype=np.int32) + 1000 * q for q in range(n)]
            got = comm.all_to_all(blocks[r])
            same(got, np.concatenate([blocks[q][r * 5:(r + 1) * 5] for q in range(n)]), f"parent all_to_all rank {r}")
        thread.join(timeout=120)
        assert not thread.is_alive(), f"rank {r}: the child's thread did not finish in 120 s"
        if failures:
            raise failures[0]
        child.destroy()
        sys.stdout.write(f"rank {r} ok split_concurrent\n")
        sys.stdout.flush()


if __name__ == "__main__":
    globals()[sys.argv[1]](sys.argv[2:])
