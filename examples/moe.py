"""Mixture-of-experts dispatch and combine with all_to_all over a split group, checked bitwise.

Run it as N ranks (N a multiple of 2): ``python -m collectives.tools.launcher -g 4 examples/moe.py`` (add
``--nodes 2`` for two emulated nodes) or ``mpirun -n 4 python examples/moe.py``.  The world is split into
expert-parallel groups of EP = 2 ranks, strided (ranks r and r + N/2: across the two nodes with ``--nodes 2``;
``comm.split(color=rank % (N // EP))``, NCCL's ``ncclCommSplit``), one expert per rank of the group, as in
DeepSpeed-MoE or Megatron's expert parallelism.

One MoE layer on each rank's T tokens:
* route: each token goes to the expert with the largest router score (top-1), gated by its softmax probability;
  each expert takes at most C tokens from each rank (the capacity; the rest are dropped, as a capacity factor
  does), so every block of the exchange has the same size;
* dispatch: ``ep_comm.all_to_all`` sends block e of the (EP, C, D) buffer to expert e's rank (NCCL 2.30's
  ``ncclAlltoAll``: one group of a send and a receive per peer);
* expert: rank e applies its expert, ``tanh(tokens @ W_e)``, to the (EP, C, D) tokens it received;
* combine: a second ``all_to_all`` returns every block to the rank it came from, which scatters the results back
  to its tokens' places times their gates;
* statistics: the tokens each expert received, summed over the group (``all_reduce``, int32: exact).
Every rank recomputes its whole group's layer alone in numpy, from the same seeds; the dispatched tokens, the
layer's output and the statistics must be bitwise equal.  Any difference raises.
"""
from __future__ import annotations

import sys

import numpy as np

import collectives

EP, T, D, C = 2, 40, 32, 16  # experts per group, tokens per rank, width, capacity per (rank, expert)


def tokens(rank: int) -> np.ndarray:
    return np.random.default_rng([3, rank]).standard_normal((T, D)).astype(np.float32)


def router() -> np.ndarray:
    return np.random.default_rng([5]).standard_normal((D, EP)).astype(np.float32)


def expert(e: int) -> np.ndarray:
    return (np.random.default_rng([9, e]).standard_normal((D, D)) / np.sqrt(D)).astype(np.float32)


def route(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-1 routing with capacity: (the (EP, C, D) dispatch buffer, each slot's token index or -1, gates)."""
    scores = x @ router()
    probs = np.exp(scores - scores.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    choice = probs.argmax(1)
    buf = np.zeros((EP, C, D), np.float32)
    slot_token = np.full((EP, C), -1, np.int64)
    for e in range(EP):
        chosen = np.flatnonzero(choice == e)[:C]  # beyond the capacity: dropped
        buf[e, :len(chosen)] = x[chosen]
        slot_token[e, :len(chosen)] = chosen
    return buf, slot_token, probs[np.arange(T), choice].astype(np.float32)


def combine(back: np.ndarray, slot_token: np.ndarray, gates: np.ndarray) -> np.ndarray:
    """Each returned slot back to its token, times the token's gate; dropped tokens give 0."""
    out = np.zeros((T, D), np.float32)
    for e in range(EP):
        for c in np.flatnonzero(slot_token[e] >= 0):
            t = slot_token[e, c]
            out[t] = back[e, c] * gates[t]
    return out


def layer_alone(group_ranks: list[int], me: int) -> dict:
    """The whole group's layer in one process, for the rank at index ``me`` of the group."""
    routed = [route(tokens(q)) for q in group_ranks]
    received = np.stack([routed[q][0][me] for q in range(EP)])       # what expert ``me`` gets from each rank
    results = [np.tanh(np.stack([routed[q][0][e] for q in range(EP)]).reshape(-1, D) @ expert(e)).reshape(EP, C, D)
               for e in range(EP)]                                      # every expert's output
    back = np.stack([results[e][me] for e in range(EP)])             # what comes back to rank ``me``
    counts = sum(np.array([(routed[q][1][e] >= 0).sum() for e in range(EP)], np.int32) for q in range(EP))
    return {"received": received, "out": combine(back, routed[me][1], routed[me][2]), "counts": counts}


def main() -> None:
    with collectives.Communicator() as comm:
        r, n = comm.rank, comm.nranks
        if n % EP:
            raise SystemExit(f"moe.py: needs a multiple of {EP} ranks, got {n}")
        groups = n // EP
        ep_comm = comm.split(color=r % groups, key=r)
        me = ep_comm.rank
        buf, slot_token, gates = route(tokens(r))
        received = ep_comm.all_to_all(buf.ravel()).reshape(EP, C, D)        # dispatch
        y = np.tanh(received.reshape(-1, D) @ expert(me)).reshape(EP, C, D)  # this rank's expert
        back = ep_comm.all_to_all(y.ravel()).reshape(EP, C, D)              # combine
        out = combine(back, slot_token, gates)
        counts = ep_comm.all_reduce(np.array([(slot_token[e] >= 0).sum() for e in range(EP)], np.int32))
        want = layer_alone([r % groups + q * groups for q in range(EP)], me)
        for name, got in (("received", received), ("out", out), ("counts", counts)):
            if not np.array_equal(got.view(np.uint32), want[name].view(np.uint32)):  # bitwise
                raise AssertionError(f"rank {r}: the {name} tokens differ from the layer computed alone")
        ep_comm.destroy()
        sys.stdout.write(f"rank {r} expert {me} of group {r % groups}: ok, bitwise; tokens per expert "
                         f"{counts.tolist()}, {int((slot_token >= 0).sum())} of {T} kept\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
