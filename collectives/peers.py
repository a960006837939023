"""What every rank tells every other at init (NCCL ``src/init.cc``: ``initTransportsRank``, the ``ncclPeerInfo``
allgather and ``fillInfo``), and what follows from it: the nodes (``nodesFirstRank``, by host hash), this rank's
local peers, the channel count of the search (the minimum over ranks, as NCCL's ``comm->nChannels``), and the
settings every rank must share (buffer sizes, ``NCCL_PROTO``, ``NCCL_ALGO``, the device).  The search's graphs
cross in a second allgather (``graph.init_rank``: AllGather3).

The peer info crosses the bootstrap as a fixed binary layout (``PEER_INFO``, then the two variable texts and the
explicit rings, each bounded), as NCCL's ``struct ncclPeerInfo`` does; a peer's bytes that do not decode end init
with a line naming that rank.
"""
from __future__ import annotations

import os
import secrets
import socket
import struct
from dataclasses import dataclass

from collectives.include.device import MAXCHANNELS
from collectives.include.protocols import PROTOS
from collectives.misc import sockets
from collectives.misc.sockets import BootstrapError

from .bootstrap import NCCL_MAGIC
from .graph.connect import max_nchannels, min_nchannels

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


# rank, host hash, pid, host name, search channels, each protocol's buffer size (PROTOS order), NCCL_MAX/MIN_NCHANNELS,
# shared-memory tag, device, then the lengths of NCCL_PROTO's and NCCL_ALGO's texts and the ring count
PEER_INFO = struct.Struct(f"<iQi64si{len(PROTOS)}qii12s16sHHH")
MAX_SETTING_TEXT = 1024  # NCCL_PROTO / NCCL_ALGO as given (NCCL's own parser has no bound; ours is generous)


def _field(text: str, size: int, what: str) -> bytes:
    raw = text.encode()
    if len(raw) > size:
        raise ValueError(f"{what} {text!r} is longer than {size} bytes")
    return raw


def encode_peer_info(info: dict, nranks: int) -> bytes:
    """``fillInfo``'s struct, as bytes: fixed fields, then the two setting texts and the explicit rings."""
    proto, algo = _field(info["proto"], MAX_SETTING_TEXT, "NCCL_PROTO"), _field(info["algo"], MAX_SETTING_TEXT,
                                                                               "NCCL_ALGO")
    rings = info["rings"] or []
    if any(len(ring) != nranks for ring in rings):
        raise ValueError(f"rings {rings}: each ring must list all {nranks} ranks")
    head = PEER_INFO.pack(info["rank"], info["host_hash"], info["pid"], _field(info["host"][:64], 64, "host name"),
                          info["nchannels"], *(info["buff_sizes"][p] for p in PROTOS), info["max_channels"],
                          info["min_channels"], _field(info["tag"], 12, "tag"),
                          _field(info["device"], 16, "device"), len(proto), len(algo), len(rings))
    flat = [r for ring in rings for r in ring]
    return head + proto + algo + struct.pack(f"<{len(flat)}i", *flat)


def peer_info_bound(nranks: int) -> int:
    """The most bytes one rank's peer info may take (checked before a peer's bytes are read)."""
    return PEER_INFO.size + 2 * MAX_SETTING_TEXT + 4 * nranks * MAXCHANNELS


def decode_peer_info(raw: bytes, nranks: int, rank: int) -> dict:
    """A peer's bytes back into its info, every length checked against what the message can carry."""
    def bad(why: str) -> BootstrapError:
        return BootstrapError(f"malformed peer info from rank {rank}: {why}")
    if len(raw) < PEER_INFO.size:
        raise bad(f"{len(raw)} bytes")
    f = PEER_INFO.unpack_from(raw)
    nproto = len(PROTOS)
    r, host_hash, pid, host = f[0], f[1], f[2], f[3]
    nch, sizes, (max_ch, min_ch, tag, device, nproto_text, nalgo_text, nrings) = \
        f[4], f[5:5 + nproto], f[5 + nproto:]
    if r != rank:
        raise bad(f"it says it is rank {r}")
    if nproto_text > MAX_SETTING_TEXT or nalgo_text > MAX_SETTING_TEXT or nrings > MAXCHANNELS:
        raise bad("a text or ring count beyond its bound")
    end = PEER_INFO.size + nproto_text + nalgo_text + 4 * nrings * nranks
    if len(raw) != end:
        raise bad(f"{len(raw)} bytes where its counts say {end}")
    pos = PEER_INFO.size
    try:
        text = lambda b: b.rstrip(b"\0").decode()  # noqa: E731
        proto, algo = raw[pos:pos + nproto_text].decode(), raw[pos + nproto_text:pos + nproto_text + nalgo_text].decode()
        info = {"rank": r, "host_hash": host_hash, "pid": pid, "host": text(host), "nchannels": nch,
                "buff_sizes": dict(zip(PROTOS, sizes)), "max_channels": max_ch, "min_channels": min_ch,
                "tag": text(tag), "device": text(device), "proto": proto,
                "algo": algo}
    except UnicodeDecodeError:
        raise bad("a text that is not UTF-8") from None
    if len(info["tag"]) != 12 or any(c not in "0123456789abcdef" for c in info["tag"]):
        raise bad("its shared-memory tag is not 12 hex digits")  # segment names are built from it
    pos += nproto_text + nalgo_text
    flat = struct.unpack_from(f"<{nrings * nranks}i", raw, pos)
    info["rings"] = [list(flat[i * nranks:(i + 1) * nranks]) for i in range(nrings)] or None
    return info


def _tag(magic: int) -> str:
    """The name of this communicator's shared memory: from a random magic (our launcher sweeps by it), else
    rank 0's random token (NCCL_COMM_ID's fixed magic would give every such job the same name)."""
    return secrets.token_hex(6) if magic in (0, NCCL_MAGIC) else f"{magic:012x}"[-12:]


def exchange(bootstrap, rank: int, nranks: int, magic: int, buff_sizes: dict, rings, search_channels: int | None,
             proto_text: str, algo_text: str, device: str = "cpu") -> Peers:
    """The allgather of peer info and the checks that every rank agrees."""
    # What the topology search would find (ring graph channels): explicit rings set it, as NCCL_RINGS did.
    nch = min(search_channels or max(DEFAULT_SEARCH_CHANNELS_CPU, len(rings or [])), MAXCHANNELS // 2)
    my_host = sockets.host_hash()
    mine = {"rank": rank, "host_hash": my_host, "pid": os.getpid(), "host": socket.gethostname(),
            "nchannels": max(1, nch), "buff_sizes": buff_sizes, "max_channels": max_nchannels(),
            "min_channels": min_nchannels(), "tag": _tag(magic),
            "rings": rings, "proto": proto_text.strip().lower(), "algo": algo_text.strip().lower(),
            "device": device}
    raw = bootstrap.allgather(encode_peer_info(mine, nranks), peer_info_bound(nranks))
    info = [decode_peer_info(b, nranks, r) for r, b in enumerate(raw)]
    for key, what in (("buff_sizes", "NCCL_*BUFFSIZE"), ("proto", "NCCL_PROTO"), ("algo", "NCCL_ALGO"),
                      ("device", "--device / NCCLLAB_DEVICE")):
        if len({repr(p[key]) for p in info}) != 1:
            raise ValueError(f"{what} differs across ranks: {[p[key] for p in info]}")
    hosts = [p["host_hash"] for p in info]
    node_of_hash: dict[int, int] = {}
    for h in hosts:
        node_of_hash.setdefault(h, len(node_of_hash))
    return Peers(info, info[0]["tag"], [node_of_hash[h] for h in hosts], len(node_of_hash),
                 [r for r in range(nranks) if hosts[r] == my_host], min(p["nchannels"] for p in info),
                 sum(p["host"] == mine["host"] for p in info))
