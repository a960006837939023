"""Rank programs for ``tests/test_hang_vs_mismatch.py``: ``hang_workers.py NAME [args]``, one process per rank
(``conftest.run_ranks(..., script="hang_workers.py")``)."""
from __future__ import annotations

import os
import sys
import time

import numpy as np

import collectives
from collectives.bootstrap import UNIQUE_ID_BYTES, get_unique_id


def fresh_uid(control) -> bytes:
    """A new communicator's unique id from rank 0, handed on through ``control``'s bootstrap (the launcher's
    NCCL_COMM_ID names the first communicator's root only)."""
    uid = b""
    if control.rank == 0:
        comm_id = os.environ.pop("NCCL_COMM_ID", None)
        uid = get_unique_id().to_bytes()
        if comm_id is not None:
            os.environ["NCCL_COMM_ID"] = comm_id
    return control.bootstrap.allgather(uid, UNIQUE_ID_BYTES)[0]


def mismatch_rounds(args: list[str]) -> None:
    """ROUNDS BAD SEED ALGO: ROUNDS times, a fresh communicator on which rank BAD calls AllReduce with another
    count than the others, each round's reports in ``$NCCLLAB_HANG_DIR/round<i>``.  Before the mismatched call
    every rank sleeps a random 0-30 ms (from SEED), so that rounds differ in who is already blocked and who finds
    the mismatch at once, the race of issue 24.  Every rank must fail; the job exits 0 when all did."""
    rounds, bad, seed, algo = int(args[0]), int(args[1]), int(args[2]), args[3]
    base = os.environ["NCCLLAB_HANG_DIR"]
    control = collectives.Communicator()  # never fails: carries the ids and the barrier between rounds
    rng = np.random.default_rng([seed, control.rank])
    failed = 0
    for i in range(rounds):
        uid = fresh_uid(control)
        os.environ["NCCLLAB_HANG_DIR"] = os.path.join(base, f"round{i}")
        comm = collectives.Communicator(uid, control.nranks, control.rank, algorithms=algo)
        comm.all_reduce(np.ones(1024, np.float32))  # a matching call first: the mismatch is at opCount 1
        time.sleep(float(rng.uniform(0, 0.03)))
        try:
            comm.all_reduce(np.ones(4000 if comm.rank == bad else 4096, np.float32))
            print(f"round {i} rank {comm.rank}: unexpected success", flush=True)
        except collectives.CollectiveError:
            failed += 1
        comm.destroy()
        control.bootstrap.barrier()
    control.destroy()
    print(f"rank {control.rank}: {failed} of {rounds} rounds failed", flush=True)
    sys.exit(0 if failed == rounds else 1)


if __name__ == "__main__":
    globals()[sys.argv[1]](sys.argv[2:])
