"""A two-stage pipeline-parallel training step with send/recv, checked bitwise.

Run it as N ranks (N even): ``python -m collectives.tools.launcher -g 4 examples/pipeline.py`` or
``mpirun -n 4 python examples/pipeline.py``.  Ranks 0 .. N/2-1 are stage 0, the others stage 1; rank r of
stage 0 feeds rank r + N/2 of stage 1 (a pipeline replica per pair, N/2 data-parallel replicas).

One step, GPipe style, over M microbatches:
* forward: stage 0 computes ``h = tanh(x @ W0)`` and sends it (``comm.send``, a group of its own: it returns
  once the peer's matching ``recv`` has run); stage 1 receives it, computes ``y = h @ W1`` and the loss;
* backward: stage 1 sends every microbatch's ``dL/dh`` back in one group (``with collectives.group():``, one
  kernel plan, NCCL's ``ncclGroupStart``/``ncclGroupEnd``), stage 0 receives them in one group too, and each
  stage accumulates its weight gradient;
* data parallel: each stage's ranks sum their gradients with ``all_reduce`` on a communicator split off by stage
  (``comm.split(color=stage)``, NCCL's ``ncclCommSplit``).
Every rank then recomputes the whole step alone in numpy, from the same seeds: what it received must be bitwise
what its peer computed, and its reduced gradient bitwise the reference's (``collectives.perf.reference``, the
ring order NCCL sums in).  Any difference raises.
"""
from __future__ import annotations

import sys

import numpy as np

import collectives
from collectives.perf.reference import all_reduce as reference_all_reduce

B, D, M = 16, 64, 4  # microbatch rows, width, microbatches


def weights(stage: int) -> np.ndarray:
    return (np.random.default_rng([7, stage]).standard_normal((D, D)) / np.sqrt(D)).astype(np.float32)


def batch(replica: int, m: int) -> tuple[np.ndarray, np.ndarray]:
    """Microbatch ``m`` of data-parallel replica ``replica``: its inputs and targets."""
    rng = np.random.default_rng([11, replica, m])
    return rng.standard_normal((B, D)).astype(np.float32), rng.standard_normal((B, D)).astype(np.float32)


def step_alone(replica: int) -> dict:
    """The whole step of one replica in one process: every activation, gradient and loss."""
    w0, w1 = weights(0), weights(1)
    out = {"h": [], "dh": [], "dw0": np.zeros((D, D), np.float32), "dw1": np.zeros((D, D), np.float32), "loss": 0.0}
    for m in range(M):
        x, target = batch(replica, m)
        h = np.tanh(x @ w0)
        y = h @ w1
        dy = (y - target) / np.float32(B * M)
        out["loss"] += float(np.sum((y - target) ** 2)) / (2 * B * M)
        dh = dy @ w1.T
        out["dw1"] += h.T @ dy
        out["dw0"] += x.T @ (dh * (1 - h * h))
        out["h"].append(h)
        out["dh"].append(dh)
    return out


def main() -> None:
    with collectives.Communicator() as comm:
        r, n = comm.rank, comm.nranks
        if n % 2:
            raise SystemExit(f"pipeline.py: needs an even number of ranks, got {n}")
        half = n // 2
        stage, replica = divmod(r, half)
        peer = r + half if stage == 0 else r - half
        stage_comm = comm.split(color=stage, key=replica)
        w = weights(stage)
        dw = np.zeros((D, D), np.float32)
        hs, loss = [], 0.0
        for m in range(M):  # forward, one microbatch at a time
            x, target = batch(replica, m)
            if stage == 0:
                h = np.tanh(x @ w)
                comm.send(h, peer)
                hs.append(h)
            else:
                h = np.empty((B, D), np.float32)
                comm.recv(h, peer)
                hs.append(h)
        dhs = [np.empty((B, D), np.float32) for _ in range(M)]
        with collectives.group():  # backward: every microbatch's gradient in one group, one plan
            for m in range(M):
                if stage == 1:
                    _, target = batch(replica, m)
                    y = hs[m] @ w
                    dy = (y - target) / np.float32(B * M)
                    loss += float(np.sum((y - target) ** 2)) / (2 * B * M)
                    dhs[m] = dy @ w.T
                    dw += hs[m].T @ dy
                    comm.send(dhs[m], peer)
                else:
                    comm.recv(dhs[m], peer)
        if stage == 0:
            for m in range(M):
                x, _ = batch(replica, m)
                dw += x.T @ (dhs[m] * (1 - hs[m] * hs[m]))
        reduced = stage_comm.all_reduce(dw)
        check(stage, replica, hs, dhs, reduced, stage_comm)
        stage_comm.destroy()
        sys.stdout.write(f"rank {r} stage {stage} replica {replica}: ok, bitwise; "
                         f"{'loss %.6f' % loss if stage else 'activations sent'}\n")
        sys.stdout.flush()


def check(stage: int, replica: int, hs: list, dhs: list, reduced: np.ndarray, stage_comm) -> None:
    """The step against ``step_alone``: activations and gradients bitwise, the reduced gradient bitwise the
    reference's sum of every replica's gradient in NCCL's order."""
    mine = step_alone(replica)
    for m in range(M):
        for name, got, want in (("h", hs[m], mine["h"][m]), ("dh", dhs[m], mine["dh"][m])):
            if not np.array_equal(got.view(np.uint32), want.view(np.uint32)):
                raise AssertionError(f"stage {stage} replica {replica}: {name} of microbatch {m} differs")
    key = "dw0" if stage == 0 else "dw1"
    grads = [step_alone(q)[key].ravel() for q in range(stage_comm.nranks)]
    want = reference_all_reduce(grads, "sum", **stage_comm.reference_config("AllReduce", D * D, np.float32))
    if not np.array_equal(reduced.ravel().view(np.uint32), want.view(np.uint32)):
        raise AssertionError(f"stage {stage} replica {replica}: reduced {key} differs from the reference")


if __name__ == "__main__":
    main()
