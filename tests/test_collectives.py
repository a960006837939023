"""Bitwise equality with the NCCL-order reference, across real processes (the acceptance matrix of issue 2)."""

import pytest

from workers import ALL, Case
from conftest import run_ranks

FLOATS = ["float32", "float16", "bfloat16"]
# chunkCount for Ring/Simple AllReduce float32 is 65536 on one CPU node (512 KiB FIFOs) and 524288 with NCCL's 4 MiB:
# n*chunkCount+ is "larger than a full loop".


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_small_counts_all_collectives(n):
    run_ranks(n, "bitwise", Case(channels=1, counts=[0, 1, 7, 1023], dtypes=FLOATS).arg())


@pytest.mark.parametrize("n,nch,rings", [
    (4, 2, [[0, 2, 1, 3], [3, 1, 2, 0]]),
    (4, 4, [[1, 0, 3, 2]]),
    (3, 2, None),
])
def test_channels_and_explicit_rings(n, nch, rings):
    run_ranks(n, "bitwise", Case(channels=nch, rings=rings or None, counts=[1, 7, 1023, 70001], dtypes=FLOATS).arg())


def test_prime_above_a_million_and_beyond_one_loop():
    # 1_000_003 (prime) and 2*524288+4099: two loops, the last one shortened (n=2, float32 chunk 524288 with
    # NCCL's 4 MiB FIFOs, named here since one CPU node defaults to 512 KiB)
    run_ranks(2, "bitwise", Case(channels=2, rings=[[1, 0]], counts=[1_000_003, 2 * 524288 + 4099],
                                 dtypes=["float32"]).arg(), env={"NCCL_BUFFSIZE": str(1 << 22)})


def test_beyond_one_loop_fp16_bf16_n3():
    # fp16 chunkCount is 131072 (512 KiB FIFOs): 3 ranks * 1048576 + 37 takes 8 loops and a short ninth.
    run_ranks(3, "bitwise", Case(channels=1, counts=[3 * 1048576 + 37], dtypes=["float16", "bfloat16"],
                                 colls=["allreduce", "reducescatter"]).arg())


def test_eight_ranks():
    run_ranks(8, "bitwise", Case(channels=2, rings=[[0, 7, 1, 6, 2, 5, 3, 4]], counts=[0, 1, 1023, 300007],
                                 dtypes=FLOATS, colls=ALL).arg())


def test_avg_prod_min_max_floats():
    run_ranks(4, "bitwise", Case(channels=2, counts=[7, 4099], dtypes=FLOATS + ["float64"],
                                 colls=["allreduce", "reducescatter", "reduce"],
                                 ops=["avg", "prod", "min", "max"]).arg())


def test_step_counters_carry_over():
    # Many collectives of mixed sizes on one communicator: steps round up per call and carry over.
    run_ranks(3, "bitwise", Case(channels=2, counts=[5, 100003, 3, 4099, 1, 262147], dtypes=["float32"]).arg())
