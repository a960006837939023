"""LL and LL128: bitwise against the reference, flags that never admit a torn or stale line, flag wrap-around."""
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from collectives.device import ll_kernels as K
from collectives.graph import tuning
from workers import ALL, Case
from conftest import ROOT, run_ranks

FLOATS = ["float32", "float16", "bfloat16"]


@pytest.mark.parametrize("proto", ["LL", "LL128"])
@pytest.mark.parametrize("n", [2, 3])
def test_bitwise_all_collectives(proto, n):
    # 0 B .. past one LL128 step (576,000 B) and many LL steps; odd counts; several calls per communicator.
    counts = [0, 1, 7, 1023, 4099, 160_001]
    run_ranks(n, "bitwise", Case(channels=2, counts=counts, dtypes=FLOATS).arg(), env={"NCCL_PROTO": proto})


@pytest.mark.parametrize("proto", ["LL", "LL128"])
def test_bitwise_four_and_eight_ranks(proto):
    run_ranks(4, "bitwise", Case(channels=1, rings=[[0, 2, 3, 1]], counts=[3, 65_537], dtypes=FLOATS, colls=ALL).arg(),
              env={"NCCL_PROTO": proto})
    run_ranks(4, "bitwise", Case(channels=1, counts=[1_000_003], dtypes=["float32"],
                                 colls=["allreduce", "reducescatter", "allgather"]).arg(), env={"NCCL_PROTO": proto})
    run_ranks(8, "bitwise", Case(channels=2, counts=[1, 1023, 40_009], dtypes=FLOATS, colls=ALL).arg(),
              env={"NCCL_PROTO": proto})


def test_protocols_mixed_on_one_communicator():
    # Simple for AllReduce, LL for the others: steps round up for Simple and carry over through LL steps.
    run_ranks(3, "bitwise", Case(channels=1, counts=[5, 70_001, 2, 300_007], dtypes=["float32"]).arg(),
              env={"NCCL_PROTO": "LL;allreduce:Simple"})


def test_ll_flag_wraparound_with_small_clean_mask():
    # NCCL's test build: flags modulo 256 and clean mask 0x78.  Hundreds of steps of alternating sizes pass the
    # wrap several times; a line kept from 256 steps earlier would carry the current flag without the cleanup.
    sizes = [4096, 3, 8190, 1, 6000, 2, 4096, 5] * 6
    run_ranks(2, "bitwise", Case(channels=1, counts=sizes, dtypes=["float32"], colls=["allreduce"]).arg(),
              env={"NCCL_PROTO": "LL", "NCCLLAB_LL_FLAG_MOD": "256", "NCCLLAB_LL_CLEAN_MASK": "0x78"})


def test_clean_mask_is_what_prevents_a_stale_line_after_wrap():
    """Deterministic: a slot's line left by a big transfer 256 steps ago carries the flag of step s+256."""
    words = np.zeros(2 * 64, np.uint64)   # one 64-line slot
    data = np.arange(64, dtype=np.uint64) + 1000
    K.ll_pack(words, data, 64, 9)         # step 8 (flag 9) fills all 64 lines
    out = np.zeros(64, np.uint64)
    # 256 steps later, the flag is 9 again (mod 256); the sender has written only line 0 so far.
    K.ll_pack(words, np.array([7], np.uint64), 1, 9)
    assert K.ll_poll_unpack(words, out, 0, 4, 9) == 4, "without cleanup the stale lines 1..3 pass as current"
    # With cleanup somewhere in between (a clean step rewrote every line with its own flag), they do not.
    K.ll_fill(words, 1, 64, 137)
    assert K.ll_poll_unpack(words, out, 0, 4, 9) == 1


TORN_WRITER = r"""
import sys, numpy as np
from collectives.misc.shm_segment import ShmSegment
seg = ShmSegment(sys.argv[1], 1 << 16, create=False)
w = seg.u64(0, 4096)
cmd = sys.stdin.readline
def ack(): print("ok", flush=True)
flag = 5
for line in iter(cmd, ""):
    op = line.split()
    if op[0] == "ll_data":        # word 0 of line i: data with the *old* flag; word 1 untouched
        i = int(op[1]); w[2 * i] = np.uint64(111 + i) | (np.uint64(flag - 1) << np.uint64(32))
    elif op[0] == "ll_word0":     # word 0 complete and current, word 1 not yet
        i = int(op[1]); w[2 * i] = np.uint64(111 + i) | (np.uint64(flag) << np.uint64(32))
    elif op[0] == "ll_word1":
        i = int(op[1]); w[2 * i + 1] = np.uint64(222 + i) | (np.uint64(flag) << np.uint64(32))
    elif op[0] == "ll128_data":   # data words of slice 0, no flags
        w[:256] = 0; w[:256].reshape(16, 16)[:, :15] = 77
    elif op[0] == "ll128_flag":   # flag word of line j
        j = int(op[1]); w[16 * j + 15] = np.uint64(int(op[2]))
    elif op[0] == "quit":
        break
    ack()
"""


class Writer:
    def __init__(self, name):
        self.p = subprocess.Popen([sys.executable, "-c", TORN_WRITER, name], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=ROOT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})

    def do(self, cmd):
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        assert self.p.stdout.readline().strip() == "ok"

    def close(self):
        self.p.stdin.write("quit\n")
        self.p.stdin.flush()
        self.p.wait(timeout=30)


def test_torn_lines_from_another_process_are_never_accepted():
    from collectives.misc.shm_segment import ShmSegment
    seg = ShmSegment(f"nccllab-torn{os.getpid()}-x", 1 << 16, create=True)
    try:
        w = seg.u64(0, 4096)
        out = np.zeros(64, np.uint64)
        writer = Writer(seg.name)
        try:
            # LL, flag 5: a line with data but an old flag; half a line; lines out of order.
            writer.do("ll_data 0")
            assert K.ll_poll_unpack(w, out, 0, 2, 5) == 0, "stale flag accepted"
            writer.do("ll_word0 0")
            assert K.ll_poll_unpack(w, out, 0, 2, 5) == 0, "line with one current flag accepted"
            writer.do("ll_word0 1")
            writer.do("ll_word1 1")       # line 1 complete before line 0
            assert K.ll_poll_unpack(w, out, 0, 2, 5) == 0, "reader skipped an incomplete line"
            writer.do("ll_word1 0")
            assert K.ll_poll_unpack(w, out, 0, 2, 5) == 2
            assert out[0] == 111 | (222 << 32) and out[1] == 112 | (223 << 32)
            # LL128, flag 9: data without flags, flags of a previous step, then flags line by line.
            writer.do("ll128_data")
            assert K.ll128_ready(w, 0, 16, np.uint64(9)) == 0
            for j in range(16):
                writer.do(f"ll128_flag {j} 8")   # previous step's flag: stale
            assert K.ll128_ready(w, 0, 16, np.uint64(9)) == 0
            for j in (0, 1, 2, 4):           # out of order: line 3 still stale
                writer.do(f"ll128_flag {j} 9")
            assert K.ll128_ready(w, 0, 16, np.uint64(9)) == 3
        finally:
            writer.close()
    finally:
        seg.unlink()


def test_ll128_layout_roundtrip_and_flag_positions():
    data = np.arange(2 * 240, dtype=np.uint64) + 1
    wire = np.zeros(512, np.uint64)
    K.ll128_pack(wire, data, 2, K.LL128_PERM)
    assert (wire.reshape(-1, 16)[:, 15] == 0).all(), "pack must not touch flag words"
    K.ll128_set_flags(wire, 32, np.uint64(3))
    assert (wire.reshape(-1, 16)[:, 15] == 3).all()
    back = np.zeros_like(data)
    K.ll128_unpack(wire, back, 0, 2, K.LL128_PERM)
    assert (back == data).all()
    # Lane 0 of group 0 stores chunk 0 (data words 0, 1) at wire words 0, 1; lane 7 (a flag lane) stores the first
    # half of chunk 7 in word 14 of line 0 and its second half in word 14 of line 4.
    assert wire[0] == 1 and wire[1] == 2
    assert wire[14] == data[14] and wire[4 * 16 + 14] == data[15]


def test_proto_grammar():
    t = tuning.parse_list("^LL128;allreduce:LL128", tuning.PROTOS, "NCCL_PROTO")
    assert t["AllReduce"] == {"LL": False, "LL128": True, "Simple": False}
    assert t["Broadcast"] == {"LL": True, "LL128": False, "Simple": True}
    assert tuning.parse_list("ll,SIMPLE", tuning.PROTOS, "NCCL_PROTO")["Reduce"]["LL128"] is False
    with pytest.raises(tuning.TuningError, match="unrecognized element"):
        tuning.parse_list("LL,LL256", tuning.PROTOS, "NCCL_PROTO")
    with pytest.raises(tuning.TuningError, match="prefix"):
        tuning.parse_list("LL;Simple", tuning.PROTOS, "NCCL_PROTO")
    with pytest.raises(tuning.TuningError, match="unrecognized prefix"):
        tuning.parse_list("alltoall:LL", tuning.PROTOS, "NCCL_PROTO")
    a = tuning.parse_list("ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring", tuning.ALGOS,
                          "NCCL_ALGO")
    assert a["AllReduce"]["Ring"] is False and a["Broadcast"]["Ring"] is True and a["Reduce"]["Ring"] is True
    with pytest.raises(tuning.TuningError, match="No algorithm"):
        from collectives.graph.cost_model import CostModel
        from collectives.graph.presets import cpu_lab
        CostModel(cpu_lab(4), proto_env="^LL,LL128,Simple").choose("AllReduce", 1024)


@pytest.mark.parametrize("env,match", [({"NCCL_PROTO": "LL64"}, "unrecognized element"),
                                       ({"NCCL_ALGO": "Tree"}, "No algorithm"),
                                       ({"NCCL_ALGO": "Rng"}, "unrecognized element")])
def test_bad_proto_or_algo_is_a_clear_error_on_every_rank(env, match):
    proc = run_ranks(2, "bitwise", Case(channels=1, counts=[7], dtypes=['float32']).arg(),
        env=env, check=False, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.count(match) >= 2, proc.stderr[-2000:]


def _ll_sender(monkeypatch, step: int):
    """A real PrimitivesLL sender over an in-memory connector (no peer needed for ``store``)."""
    from collectives.device import prims_ll
    from collectives.device.reduce_copy import RedOp
    from collectives.include import device
    from collectives.include.connector import Connector
    monkeypatch.setattr(prims_ll, "LL_CLEAN_MASK", 0x78)
    monkeypatch.setattr(device, "LL_FLAG_MOD", 256)
    z = lambda dt: np.zeros(1, dt)  # noqa: E731
    conn = Connector(peer=1, is_send=True, buffs={"LL": np.zeros(8 * 1024, np.uint8)}, head=z(np.uint64),
                     tail=z(np.uint64), head_sleep=z(np.uint32), tail_sleep=z(np.uint32), doorbell=z(np.uint32))
    conn.step = step
    x = np.arange(4, dtype=np.float32)
    kernel = types.SimpleNamespace(tracer=None)  # store() needs no scheduling
    prims = prims_ll.PrimitivesLL(kernel, 0, None, conn, x, x, RedOp("sum", np.dtype(np.float32), 2))
    prims.sbuf[:2] = x.view(np.uint64)
    return prims, conn


@pytest.mark.parametrize("step,cleaned", [(0x78, True), (0x7F, True), (0xF8, True), (0x77, False), (0x80, False)])
def test_ll_store_cleans_the_rest_of_the_slot_on_clean_mask_steps(monkeypatch, step, cleaned):
    prims, conn = _ll_sender(monkeypatch, step)
    prims.store(0, 16)  # send peer 0: 2 lines of data in a 64-line slot
    words = conn.slot("LL", step, 1024).view(np.uint64)
    flags = (words >> np.uint64(32)).reshape(-1, 2)
    flag = (step + 1) % 256
    assert (flags[:2] == flag).all()
    assert (flags[2:] == flag).all() if cleaned else (flags[2:] == 0).all()
