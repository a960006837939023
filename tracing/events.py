"""Chunk-level trace events, shaped after NCCL's profiler plugin hierarchy (``src/include/plugin/nccl_profiler.h``:
Coll -> KernelCh -> primitive call -> step).

Off unless ``NCCLLAB_TRACE=<dir>``.  Each rank keeps its events as tuples in memory and writes
``<dir>/trace-rank<r>.jsonl`` when its communicator is destroyed (and on errors): one JSON object per line, the
first line the communicator's description.  ``tracing.export`` merges ranks and converts.
Times are ``time.monotonic_ns()`` (CLOCK_MONOTONIC, one clock for every process on a host).
"""
from __future__ import annotations

import json
import os
import time

now = time.monotonic_ns

# Field order of each record kind (kept as tuples while tracing, named when written).
FIELDS = {
    "coll": ("seq", "func", "algo", "proto", "count", "dtype", "op", "root", "nchannels", "t0", "t1", "plan"),
    # one kernel plan (ncclKernelPlan): a lone collective, or a group's collectives (their seqs) and p2p works
    "plan": ("plan", "colls", "p2p", "t0", "t1"),
    # one channel's part of a p2p work (profiler KernelCh of a p2p op): the peer, the p2pSchedule round, the
    # part's byte range of the user's buffer; proto "copy" for a send to oneself
    "p2p": ("plan", "channel", "peer", "is_send", "round", "offset", "bytes", "proto", "t0", "t1"),
    "channel": ("seq", "channel", "part_offset", "part_count", "chunk_count", "t0", "t1"),
    "prim": ("seq", "channel", "prim", "recv_peer", "send_peer", "loop", "chunk", "offset", "count", "t0", "t1"),
    "step": ("seq", "channel", "prim", "recv_peer", "send_peer", "loop", "chunk", "slice", "slot", "step",
             "offset", "count", "bytes", "t0", "t_ready", "t1"),
    # NET proxy (profiler ProxyOp / ProxyStep): one op per connection per collective, one step per message;
    # t_wait = data ready (SendGPUWait ends) or irecv posted, t_post = isend issued, t1 = test() said done.
    "proxy_op": ("seq", "channel", "peer", "is_send", "proto", "nsteps", "t0", "t1"),
    "proxy_step": ("seq", "channel", "peer", "is_send", "step", "slot", "bytes", "t0", "t_post", "t1"),
    # NET/IB plugin (an instant, t0 == t1): event = cts_posted (receiver wrote its CTS FIFO entry), cts_seen
    # (sender found it), wr_posted (a data WR on QP index qp), completion (a CQE for the request; qp = qp_num).
    "net_ib": ("seq", "channel", "peer", "is_send", "event", "slot", "qp", "bytes", "t0", "t1"),
}


class Tracer:
    def __init__(self, directory: str, rank: int, meta: dict):
        self.dir, self.rank, self.meta = directory, rank, meta
        self.records: list[tuple] = []
        self.plans = 0
        os.makedirs(directory, exist_ok=True)

    def add(self, kind: str, *values) -> None:
        self.records.append((kind, values))

    def add_plan(self, colls: list[tuple], p2p: int, t0: int, t1: int) -> int:
        """One kernel launch: a ``coll`` record for each of its collectives (``colls``: their values without the
        plan id), then the ``plan`` record; returns the plan id (this rank's launch count)."""
        plan = self.plans
        self.plans += 1
        for values in colls:
            self.records.append(("coll", (*values, plan)))
        self.records.append(("plan", (plan, [v[0] for v in colls], p2p, t0, t1)))
        return plan

    def path(self) -> str:
        return os.path.join(self.dir, f"trace-rank{self.rank}.jsonl")

    def flush(self) -> str:
        with open(self.path(), "w") as f:
            f.write(json.dumps({"kind": "meta", "rank": self.rank, **self.meta}) + "\n")
            for kind, values in self.records:
                f.write(json.dumps({"kind": kind, **dict(zip(FIELDS[kind], values))}) + "\n")
        return self.path()


def from_env(rank: int, meta: dict) -> Tracer | None:
    directory = os.environ.get("NCCLLAB_TRACE", "").strip()
    return Tracer(directory, rank, meta) if directory else None


def read_rank_file(path: str) -> tuple[dict, list[dict]]:
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    return lines[0], lines[1:]
