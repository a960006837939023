"""What every rank tells every other at init (NCCL ``src/init.cc``: ``initTransportsRank``, the ``ncclPeerInfo``
allgather and ``fillInfo``), and what follows from it: the nodes (``nodesFirstRank``, by host hash), this rank's
local peers, the channel count of the search (the minimum over ranks, as NCCL's ``comm->nChannels``), and the
settings every rank must share (buffer sizes, ``NCCL_PROTO``, ``NCCL_ALGO``, the tree pattern).
"""
from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass

from include.device import MAXCHANNELS
from include.protocols import PROTOCOLS
from misc import sockets
from misc.param import env_int

from .graph.connect import max_nchannels, min_nchannels
from .graph.trees import tree_pattern

# The ring graph's channel count on this CPU (NCCL takes it from its topology search; Postset then doubles it).
DEFAULT_SEARCH_CHANNELS_CPU = 1


@dataclass
class Peers:
    info: list[dict]          # every rank's peer info
    tag: str                  # names this communicator's shared memory (rank 0's)
    node_of_rank: list[int]
    nnodes: int
    local_ranks: list[int]    # the ranks on this rank's node
    search_channels: int      # what the topology search found (here: 1, or one per explicit ring)
    same_machine: int = 1     # ranks on this rank's machine, whatever NCCL_HOSTID says (they share its cores)


def buffer_sizes() -> dict:
    """``computeBuffSizes``: each protocol's ``NCCL_*BUFFSIZE`` or its default.  NCCL accepts any value; below one
    chunk it would divide by zero, so that is an error here."""
    sizes = {p.name: env_int(p.buff_env, p.default_buff_size) for p in PROTOCOLS.values()}
    for p in PROTOCOLS.values():
        if sizes[p.name] < p.min_buff_size:
            raise ValueError(f"{p.buff_env}={sizes[p.name]} is too small: {p} needs at least {p.min_buff_size} "
                             f"bytes")
    return sizes


def exchange(bootstrap, rank: int, nranks: int, magic: int, buff_sizes: dict, rings, search_channels: int | None,
             proto_text: str, algo_text: str, device: str = "cpu") -> Peers:
    """The allgather of peer info and the checks that every rank agrees."""
    # What the topology search would find (ring graph channels): explicit rings set it, as NCCL_RINGS did.
    nch = min(search_channels or max(DEFAULT_SEARCH_CHANNELS_CPU, len(rings or [])), MAXCHANNELS // 2)
    my_host = sockets.host_hash()
    mine = {"rank": rank, "host_hash": my_host, "pid": os.getpid(), "host": socket.gethostname(),
            "nchannels": max(1, nch), "buff_sizes": buff_sizes, "max_channels": max_nchannels(),
            "min_channels": min_nchannels(), "tag": f"{magic:012x}"[-12:] if magic else secrets.token_hex(6),
            "rings": rings, "proto": proto_text.strip().lower(), "algo": algo_text.strip().lower(),
            "tree_pattern": tree_pattern(), "device": device}
    info = bootstrap.allgather_obj(mine)
    for key, what in (("buff_sizes", "NCCL_*BUFFSIZE"), ("proto", "NCCL_PROTO"), ("algo", "NCCL_ALGO"),
                      ("tree_pattern", "NCCLLAB_TREE_PATTERN"), ("device", "--device / NCCLLAB_DEVICE")):
        if len({repr(p[key]) for p in info}) != 1:
            raise ValueError(f"{what} differs across ranks: {[p[key] for p in info]}")
    hosts = [p["host_hash"] for p in info]
    node_of_hash: dict[int, int] = {}
    for h in hosts:
        node_of_hash.setdefault(h, len(node_of_hash))
    return Peers(info, info[0]["tag"], [node_of_hash[h] for h in hosts], len(node_of_hash),
                 [r for r in range(nranks) if hosts[r] == my_host], min(p["nchannels"] for p in info),
                 sum(p["host"] == mine["host"] for p in info))
