"""Rank programs for the hostile-input suite: ``python tests/stranger_workers.py NAME args...`` with the job's id
given on the command line (host, port, magic in hex, nranks, rank), so that the test decides when each rank starts.

``allreduce``: one communicator, a few AllReduce sizes checked bitwise against the reference, then ``OK``.
``allreduce_net_strangers``: the same, but every NET listener this rank opens, and its bootstrap ring listener, get
every kind of stranger connected (``tests/strangers.py``) before the real peer can reach them: the test's own code
opens those connections from this process right after the listener exists; the lab's code is unchanged.
"""
from __future__ import annotations

import re
import sys
import time

import numpy as np

import collectives
import strangers
from collectives.perf import reference
from collectives.bootstrap import UniqueId
from workers import independent_config

HELD: list = []  # the strangers' sockets stay open for the whole job


def _inject_into_listeners(marker: str) -> None:
    from collectives.misc import listener as lst
    original = lst.Listener.__init__

    def with_strangers(self, srv, magic, kind, what):
        original(self, srv, magic, kind, what)
        if kind != lst.SOCKET_TYPE_VERBS_WIRE:
            where = re.sub(r" of rank \d+$", "", what)
            HELD.extend(strangers.connect(self.address(), marker=marker, kind_id=kind, what=where))
    lst.Listener.__init__ = with_strangers


def main(name: str, host: str, port: str, magic: str, nranks: str, rank: str, marker: str) -> None:
    if name == "allreduce_net_strangers":
        _inject_into_listeners(marker)
    uid = UniqueId(host, int(port), int(magic, 16))
    n, r = int(nranks), int(rank)
    t0 = time.monotonic()
    with collectives.Communicator(uid, n, r) as comm:
        rng = np.random.default_rng([7, r])
        for count in (1, 1001, 65_537):
            x = rng.standard_normal(count).astype(np.float32)
            xs = comm.bootstrap.allgather_array(x)
            want = reference.all_reduce(xs, **independent_config(comm, "AllReduce", count, x.dtype))
            out = np.full(count, np.nan, np.float32)
            comm.all_reduce(x, out=out)
            assert np.array_equal(out.view(np.uint32), want.view(np.uint32)), f"rank {r}: wrong result at {count}"
        net = comm.describe()["net"]
    time.sleep(0.1)  # the watchers of the last listener's strangers
    for where, kind, seconds in strangers.DROPS:
        print(f"STRANGER {where} {kind} {seconds if seconds is None else f'{seconds:.3f}'}", flush=True)
    print(f"OK rank {r} net={net} in {time.monotonic() - t0:.2f} s", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
