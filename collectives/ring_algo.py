"""Where each step of a registered Ring AllReduce lives in the user's buffers (NCCL ``src/include/collectives.h``:
``RingARAlgorithm::getNextSendAddr`` / ``getNextRecvAddr``; built per channel in ``src/enqueue.cc``'s
``addCollToPlan`` when the proxy op is ``reg``).

With registered buffers (``register.py``) the kernel writes no NET FIFO slot, so the proxy cannot take a step's
bytes from slot ``step % NCCL_STEPS``: it works out from the step number alone which chunk and slice of
``runRing``'s schedule that step carries, and where that slice sits.  A step of the first stage of a loop (the
``send`` of chunk ``ring.index - 1``) goes out of the *send* buffer; every later one out of the *receive* buffer,
where the kernel reduced it.  Receives all land in the receive buffer, at the chunk the kernel will read next.

Offsets and sizes are in bytes, relative to the whole buffers (the channel's ``gridOffset`` included).  Empty
slices (past the end of a short chunk) have size 0 and NCCL's base address (a send's: the send buffer's).
"""
from __future__ import annotations

from collectives.include.bitops import div_up, round_up


class RingAR:
    """``RingARAlgorithm`` for one channel: ring position ``ring_index`` of ``nranks``, ``chunk_steps`` steps a
    chunk in slices of ``slice_steps``, ``chunk_size`` bytes a chunk (``slice_size``: ``stepSize * sliceSteps``),
    the channel's part ``grid_offset`` .. ``+ channel_size`` bytes, elements of ``elem_size`` bytes."""

    def __init__(self, ring_index: int, nranks: int, chunk_steps: int, slice_steps: int, chunk_size: int,
                 slice_size: int, grid_offset: int, channel_size: int, elem_size: int):
        self.ring_index, self.nranks = ring_index, nranks
        self.chunk_steps, self.slice_steps, self.slice_per_chunk = chunk_steps, slice_steps, chunk_steps // slice_steps
        self.steps_per_loop = 2 * (nranks - 1) * chunk_steps
        self.chunk_size, self.slice_size, self.loop_size = chunk_size, slice_size, nranks * chunk_size
        self.grid_offset, self.channel_size, self.elem_size = grid_offset, channel_size, elem_size

    def _slice(self, step: int, chunk: int) -> tuple[int, int]:
        """(byte offset, size) of the slice ``step`` carries, in chunk ``chunk`` of its loop."""
        esize = self.elem_size
        elem_offset = step // self.steps_per_loop * self.loop_size
        rem = self.channel_size - elem_offset
        chunk_size = self.chunk_size if rem >= self.loop_size else \
            round_up(div_up(rem // esize, self.nranks), 16 // esize) * esize  # runRing's last, shorter loop
        nelem = min(rem - chunk * chunk_size, chunk_size)
        slice_size = max(div_up(nelem // esize, 16 * self.slice_per_chunk) * 16, self.slice_size // esize // 32) \
            * esize
        slice_offset = step % self.chunk_steps // self.slice_steps * slice_size
        if nelem <= slice_offset:
            return self.grid_offset, 0
        return (self.grid_offset + elem_offset + chunk * chunk_size + slice_offset,
                max(0, min(slice_size, nelem - slice_offset)))

    def send_addr(self, step: int) -> tuple[str, int, int]:
        """``getNextSendAddr``: ("send" or "recv" buffer, byte offset, size) of send step ``step`` (counted from
        the op's first step)."""
        stage = step % self.steps_per_loop // self.chunk_steps
        chunk = (self.ring_index + self.nranks - 1 - stage % self.nranks) % self.nranks
        offset, size = self._slice(step, chunk)
        return ("send" if stage == 0 or size == 0 else "recv"), offset, size  # an empty slice: the send buffer

    def recv_addr(self, step: int) -> tuple[str, int, int]:
        """``getNextRecvAddr``: ("recv", byte offset, size) of receive step ``step``.  The stage is counted one
        chunk ahead: a loop's last receive (stage 0 again) is the final copy of chunk ``ring_index + 1``."""
        stage = (step + self.chunk_steps) % self.steps_per_loop // self.chunk_steps
        chunk = (self.ring_index + 1) % self.nranks if stage == 0 else \
            (self.ring_index + self.nranks - 1 - stage % self.nranks) % self.nranks
        offset, size = self._slice(step, chunk)
        return "recv", offset, size
