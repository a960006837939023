"""The machine's state beside a side-by-side benchmark: how fast one core reads what another core has just written.

Every SHM step of both sides (our FIFO slots, MPICH's shared-memory cells) is such a hand-off: one process writes
a slice, the process on the other core reads it.  On this VM the speed of that hand-off is not a constant: from one
minute to the next, a core reads 2 MiB that the other core has just written at about 44 GB/s, or at about 24 GB/s
(the host places the VM's two virtual cores near each other or apart, a guess: the guest cannot see it), and in the
slow state an n = 2 AllReduce of 2 MiB takes 1,000-1,250 us instead of 150 on our side and 800-1,300 instead of 320
on MPICH's (docs/measured.md).  A copy within one core runs at the same 95 GB/s in both states, so the probe
measures the hand-off itself: rank 1 reads ``PROBE_BYTES`` that rank 0 has just written into a shared segment, and
rank 0 what rank 1 wrote, alternately, the median of ``reps`` reads.  A low reading came with the slow state in most
runs measured, not in all (docs/measured.md): it names the machine's state beside a figure, it does not decide it.
The other ranks wait off the cores, so that with more ranks than cores the two probing ones are the only ones
runnable.

    mpirun -n 2 python benchmarks/core_probe.py [--reps 10]

Not an NCCL part: NCCL's tuning takes the bandwidth of intra-node links from the topology (``src/graph/topo.cc``),
never from a measurement; this is the benchmarks' account of the machine they ran on."""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from mpi4py import MPI

from collectives.misc.shm_segment import PREFIX, ShmSegment

PROBE_BYTES = 2 << 20  # a Simple FIFO slot's size order at NCCL's default 4 MiB buffer, and more than an L2 share
PROBE_REPS = 10
NAP_S = 0.0005  # how often the ranks outside the pair look whether the probe is over


class CoreProbe:
    """A segment shared by world ranks 0 and 1 (created by 0, unlinked once 1 has mapped it, so a killed run
    leaves nothing in /dev/shm); calling it returns the cross-core read bandwidth in GB/s on every rank."""

    def __init__(self, world, nbytes: int = PROBE_BYTES):
        self.world, self.nbytes = world, nbytes
        self.pair = world.Split(0 if world.rank < 2 else MPI.UNDEFINED, world.rank)
        self.seg = None
        if self.pair == MPI.COMM_NULL:
            return
        name = self.pair.bcast(f"{PREFIX}probe-{os.getpid()}-{time.monotonic_ns()}" if world.rank == 0 else None)
        if world.rank == 0:
            self.seg = ShmSegment(name, nbytes, create=True)
        self.pair.Barrier()
        if world.rank == 1:
            self.seg = ShmSegment(name, nbytes, create=False)
        self.pair.Barrier()
        self.seg.unlink()
        self.slot = self.seg.array.view(np.float32)
        self.mine = np.random.default_rng(world.rank).uniform(-1, 1, nbytes // 4).astype(np.float32)
        self.into = np.empty_like(self.mine)

    def __call__(self, reps: int = PROBE_REPS) -> float:
        gbps = 0.0
        if self.seg is not None:
            times = []
            for i in range(reps):
                writer = i % 2
                if self.world.rank == writer:
                    np.copyto(self.slot, self.mine)
                self.pair.Barrier()
                if self.world.rank != writer:
                    t0 = time.perf_counter()
                    np.copyto(self.into, self.slot)
                    times.append(time.perf_counter() - t0)
                self.pair.Barrier()
            gbps = self.nbytes / float(np.median(times)) / 1e9
        req = self.world.Ibarrier()  # the others nap here rather than spin in a barrier beside the pair
        while not req.Test():
            time.sleep(NAP_S)
        return float(self.world.allreduce(gbps)) / 2  # the two readers' mean (the others add 0), on every rank

    def close(self) -> None:
        if self.seg is not None:
            self.slot = None
            self.seg.close()
            self.seg = None
        if self.pair != MPI.COMM_NULL:
            self.pair.Free()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=PROBE_REPS)
    p.add_argument("--bytes", type=int, default=PROBE_BYTES)
    a = p.parse_args()
    world = MPI.COMM_WORLD
    if world.size < 2:
        print("core_probe.py: needs 2 ranks or more (mpirun -n 2)", file=sys.stderr)
        return 2
    probe = CoreProbe(world, a.bytes)
    gbps = probe(a.reps)
    probe.close()
    if world.rank == 0:
        print(f"# cross-core read of {a.bytes} B just written by the other rank: {gbps:.1f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
