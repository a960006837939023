"""NCCL's three protocols as descriptors (``src/device/primitives.h``: ``ProtoSimple``, ``ProtoLL``,
``ProtoLL128``), with what the host and the proxy know of each: the buffer size and its variable
(``computeBuffSizes`` in ``src/init.cc``), the grain chunk sizes are multiples of (``ncclProtoGrainSize``), the
bytes of data a step carries, how many steps a chunk and a slice take (``calcCollChunking``), the thread threshold
of the channel shrink (``NCCL_*_THREAD_THRESHOLD``), and the proxy's rule for a step being ready to send
(``sendProxyProgress`` in ``src/transport/net.cc``).  As in NCCL, where the descriptor is a template argument and
``Primitives`` is specialised on it, the primitives class of each protocol is chosen by the device code
(``collectives/device/launch.py``)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectives.misc.param import env_int

from .device import NCCL_STEPS, ll_flag

LL_FLAG_SHIFT = np.uint64(32)


@dataclass(frozen=True)
class Protocol:
    name: str                 # NCCL_PROTO's name
    id: int                   # NCCL_PROTO_LL=0, NCCL_PROTO_LL128=1, NCCL_PROTO_SIMPLE=2
    buff_env: str
    default_buff_size: int
    grain: int                # ncclProtoGrainSize
    slot_unit: int            # a FIFO slot holds whole units: LL lines, LL128 words, Simple 8-byte words
    min_buff_size: int        # one chunk: NCCL_STEPS slots of one line / wire slice / grain
    data_num: int             # data bytes per step = step bytes * data_num / data_den (LL: 1/2, LL128: 15/16)
    data_den: int
    thread_threshold: int     # bytes per thread below which topoGetAlgoInfo shrinks channels
    needs_tail: bool          # the proxy waits for tail (all but LL, whose flags travel in every line)

    def __str__(self) -> str:
        return self.name

    def step_data_bytes(self, step_bytes: int) -> int:
        """Data a FIFO slot of ``step_bytes`` carries (the rest of an LL line, or word 15 of an LL128 line, is
        flags)."""
        return step_bytes // self.data_den * self.data_num

    def chunk_slice_steps(self, algo: str, func_chunk_steps: int, func_slice_steps: int) -> tuple[int, int]:
        """``calcCollChunking``: only Ring/Simple moves several steps a chunk (the function's CHUNKSTEPS, in
        slices of SLICESTEPS); every other pair moves one step a chunk."""
        if self.name == "Simple" and algo == "Ring":
            return func_chunk_steps, func_slice_steps
        return 1, 1

    def threshold(self, algo: str, nranks: int) -> int:
        """``NCCL_LL_THREAD_THRESHOLD`` is per rank on a ring: 8 x nranks bytes a thread."""
        return self.thread_threshold * (nranks if self.name == "LL" and algo == "Ring" else 1)

    def proxy_ready(self, words: np.ndarray, tail: int, step: int, size: int) -> bool:
        """``sendProxyProgress``: step ``step`` of ``size`` bytes may go to the network once the kernel's tail has
        passed it (every protocol but LL) and, for LL, every line, for LL128 in host memory every line's flag
        word, carries the step's flag.  ``words``: the slot as 64-bit words."""
        if self.needs_tail and tail <= step:
            return False
        if self.name == "LL":
            lines = words[:2 * (-(-size // 16))]
            return bool(np.all((lines >> LL_FLAG_SHIFT) == np.uint64(ll_flag(step))))
        if self.name == "LL128":
            nlines = size // 128
            return bool(np.all(words[:nlines * 16].reshape(-1, 16)[:, 15] == np.uint64(step + 1)))
        return True


# computeBuffSizes: LL 8 lines/thread x 512 threads x 8 steps x 16 B; LL128 120 x 640 x 8 x 8; Simple 4 MiB
LL = Protocol("LL", 0, "NCCL_LL_BUFFSIZE", 524288, 16, 16, NCCL_STEPS * 32, 1, 2, 8, False)
LL128 = Protocol("LL128", 1, "NCCL_LL128_BUFFSIZE", 4915200, 1920, 8, NCCL_STEPS * 2048, 15, 16, 8, True)
SIMPLE = Protocol("Simple", 2, "NCCL_BUFFSIZE", 1 << 22, 512, 8, NCCL_STEPS * 512, 1, 1, 64, True)
PROTOCOLS = {p.name: p for p in (LL, LL128, SIMPLE)}   # in NCCL's id order
PROTOS = tuple(PROTOCOLS)


# Deliberate differences: Simple's default FIFO when every rank is a CPU rank (NCCL's 4 MiB stays for GPUs).
# On one node, NCCL's 4 MiB makes a Ring/Simple slice 1 MiB: on a GPU that sits in device memory, on a CPU each
# slice streams through DRAM between two cores.  512 KiB (64 KiB steps, 128 KiB slices) keeps the FIFOs in the
# caches: AllReduce at 16 MiB, 2-8 ranks on this 2-core machine, 1.4-2x busbw, equal at 256 KiB and 2 MiB.
CPU_NODE_SIMPLE_BUFF_SIZE = 1 << 19
# Across nodes each step is one message of the socket plugin (buffSize / NCCL_STEPS), and over TCP a byte costs
# less CPU in a bigger message: 128 MiB through a 4-rank loopback ring took 160-185 ms in 512 KiB messages, 94-109
# ms in 32 MiB ones.  32 MiB (4 MiB steps) gives AllReduce at 128 MiB 1.3-1.5x busbw at 4 x 1 and 2 x 2 emulated
# nodes, 2 and 16 MiB within 5% (docs/measured.md); the ring's last loop still cuts a small message's chunk.
CPU_NET_SIMPLE_BUFF_SIZE = 1 << 25


def buffer_sizes(cpu_nodes: int = 0) -> dict:
    """``computeBuffSizes``: each protocol's ``NCCL_*BUFFSIZE`` or its default; ``cpu_nodes``: when every rank is a
    CPU rank, how many nodes they span (0: they are not), and Simple's default is ``CPU_NODE_SIMPLE_BUFF_SIZE`` on
    one node, ``CPU_NET_SIMPLE_BUFF_SIZE`` on several.  NCCL accepts any value; below one chunk it would divide by
    zero, so that is an error here."""
    defaults = {p.name: p.default_buff_size for p in PROTOCOLS.values()}
    if cpu_nodes:
        defaults["Simple"] = CPU_NODE_SIMPLE_BUFF_SIZE if cpu_nodes == 1 else CPU_NET_SIMPLE_BUFF_SIZE
    sizes = {p.name: env_int(p.buff_env, defaults[p.name]) for p in PROTOCOLS.values()}
    for p in PROTOCOLS.values():
        if sizes[p.name] < p.min_buff_size:
            raise ValueError(f"{p.buff_env}={sizes[p.name]} is too small: {p} needs at least {p.min_buff_size} "
                             f"bytes")
    return sizes
