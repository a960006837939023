"""Work split (CBD), channel shrinking and chunk sizes: worked examples of ``scheduleCollTasksToPlan`` and ``calcCollChunking`` (``src/enqueue.cc``), and agreement between
``enqueue`` (data path) and ``reference`` (written separately)."""
import random

import numpy as np
import pytest

from collectives import enqueue
from collectives.perf import reference
from collectives.device.reduce_copy import RedOp, post_div
from collectives.graph.rings import ring_log_line, setup_ring, validate_ring

BUFFS = {"Simple": 1 << 22, "LL": 1 << 19, "LL128": 4915200}


def plan(func, count, elt, n, nch, proto="Simple"):
    return enqueue.schedule_coll(enqueue.default_tuning(n, nch, BUFFS), func, count, elt, "Ring", proto)


def test_worked_example_cbd_8_channels():
    p = plan("AllReduce", 1_000_000, 4, 4, 8)
    assert [(w.part_offset, w.part_count) for w in p.works][:2] == [(0, 126976), (126976, 126976)]
    assert [w.part_count for w in p.works] == [126976] * 7 + [111168]
    assert p.works[0].chunk_count == 524288


def test_worked_example_ll_one_channel():
    p = plan("AllReduce", 4096, 4, 4, 8, "LL")
    assert p.n_max_channels == 1 and [w.part_count for w in p.works] == [4096]
    assert p.works[0].chunk_count == 8192


def test_chunk_sizes_per_protocol():
    t = enqueue.default_tuning(4, 1, BUFFS)
    assert enqueue.calc_coll_chunking(t, "AllReduce", "Ring", "Simple") == 2097152
    assert enqueue.calc_coll_chunking(t, "AllReduce", "Ring", "LL") == 32768
    assert enqueue.calc_coll_chunking(t, "AllReduce", "Ring", "LL128") == 576000
    assert enqueue.calc_coll_chunking(t, "Broadcast", "Ring", "Simple") == 524288


def test_small_sizes_shrink_channels():
    # Ring/Simple: nBytes < nc * 512 threads * 64 B -> fewer channels.
    assert plan("AllReduce", 1024, 4, 2, 4).nchannels == 1
    assert plan("AllReduce", (4 * 512 * 64) // 4, 4, 2, 4).n_max_channels == 4
    assert plan("AllReduce", (4 * 512 * 64) // 4 - 1, 4, 2, 4).n_max_channels == 3


@pytest.mark.parametrize("func", ["AllReduce", "ReduceScatter", "AllGather", "Broadcast", "Reduce"])
def test_enqueue_agrees_with_reference_split(func):
    rng = random.Random(1234)
    for _ in range(1500):
        n, nch, elt = rng.randint(2, 16), rng.choice([1, 2, 3, 4, 8, 16, 64]), rng.choice([1, 2, 4, 8])
        proto = rng.choice(["Simple", "LL", "LL128"])
        count = rng.choice([1, 7, 1023, rng.randint(1, 1 << 24), rng.randint(1, 1 << 16)])
        p = plan(func, count, elt, n, nch, proto)
        e = 1 if func in ("AllGather", "Broadcast") else elt
        c = count * elt if e == 1 else count
        ref = reference.channel_parts(func, c, e, n, nch, proto)
        assert [(w.part_offset, w.part_count, w.chunk_count) for w in p.works] == ref, (func, n, nch, elt, count)
        assert sum(w.part_count for w in p.works) == c


def test_count_zero_has_no_work():
    assert plan("AllReduce", 0, 4, 4, 2).works == ()


def test_setup_ring_index_and_user_ranks():
    r = setup_ring([0, 3, 2, 1], 2)
    assert (r.prev, r.next, r.index, r.user_ranks) == (3, 1, 2, (2, 1, 0, 3))
    r = setup_ring([3, 1, 0, 2], 0)
    assert (r.index, r.user_ranks[0], r.prev, r.next) == (0, 0, 1, 2)


def test_ring_log_line_format():
    assert ring_log_line(0, 2, [0, 1, 2, 3]) == "Channel 00/02 : 0 1 2 3"
    assert ring_log_line(1, 2, [3, 0, 12, 5] + list(range(6, 12)) + [1, 2, 4]).startswith("Channel 01/02 :  0 12  5")
    assert ring_log_line(0, 1, list(range(100))).endswith(" 35 ...")       # dumpLine: overflow of 128 bytes
    assert ring_log_line(0, 1, list(range(200))).endswith(" 26  27")       # exactly 127 characters: no "..."


def test_validate_ring_rejects_non_permutations():
    validate_ring([2, 1, 0], 3)
    with pytest.raises(ValueError):
        validate_ring([0, 1, 1], 3)


def test_int_avg_truncates_toward_zero_like_sumpostdiv():
    x = np.array([7, -7, -8, np.iinfo(np.int32).min, 5], np.int32)
    post_div(x, 4)
    assert x.tolist() == [1, -1, -2, np.iinfo(np.int32).min // 4, 1]
    u = np.array([7, 255], np.uint8)
    post_div(u, 2)
    assert u.tolist() == [3, 127]


def test_float_avg_premultiplies_in_element_type():
    op = RedOp("avg", np.dtype(np.float16), 3)
    assert op.premul == np.float16(np.float32(1 / 3)) and op.premul.dtype == np.float16
