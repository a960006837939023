"""POSIX shared-memory segments (NCCL ``src/misc/shmutils.cc``: ``ncclShmOpen`` / ``ncclShmClose`` /
``ncclShmUnlink``).

A segment is a file under ``/dev/shm`` (what ``shm_open`` uses on Linux), sized with ``ftruncate`` and mapped with
``mmap``.  Names start with ``nccllab-<commtag>-`` so that a launcher can sweep whatever a crash left behind.
Like NCCL, the creator unlinks the name as soon as every peer has mapped it: the mapping lives on, and nothing is
left in ``/dev/shm`` even if a process is later killed; ``close`` unmaps it when its communicator is destroyed.
Like NCCL's ``ncclOsShmOpen`` the creator reserves every page with ``fallocate``, so that a full ``/dev/shm`` is an
error at creation and not a SIGBUS at the first store.
"""
from __future__ import annotations

import errno
import mmap
import os

import numpy as np

SHM_DIR = "/dev/shm"
PREFIX = "nccllab-"


class ShmError(RuntimeError):
    """A segment could not be created or mapped: the name, the size and the system's reason."""


class ShmSegment:
    def __init__(self, name: str, size: int, create: bool):
        if not name.startswith(PREFIX) or "/" in name:
            raise ValueError(f"bad segment name {name!r}")
        self.name, self.size, self.owner = name, size, create
        path = os.path.join(SHM_DIR, name)
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, size)  # tmpfs pages read as zero: counters start at 0, flags never match
                os.posix_fallocate(fd, 0, size)
            self.mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            if create:
                unlink_name(name)
            hint = f"; {SHM_DIR} is full: free it or lower NCCL_BUFFSIZE" if exc.errno == errno.ENOSPC else ""
            raise ShmError(f"failed to extend {path} to {size} bytes: {exc.strerror} "
                           f"({errno.errorcode.get(exc.errno, exc.errno)}){hint}") from None
        finally:
            os.close(fd)
        self.array = np.frombuffer(self.mm, dtype=np.uint8)

    def u64(self, offset: int, count: int = 1) -> np.ndarray:
        return self.array[offset:offset + 8 * count].view(np.uint64)

    def u32(self, offset: int, count: int = 1) -> np.ndarray:
        return self.array[offset:offset + 4 * count].view(np.uint32)

    def i64(self, offset: int, count: int = 1) -> np.ndarray:
        return self.array[offset:offset + 8 * count].view(np.int64)

    def unlink(self) -> None:
        if self.owner:
            unlink_name(self.name)
            self.owner = False

    def close(self) -> bool:
        """Unmap now (``ncclShmClose``'s munmap), rather than whenever a garbage collector finds the segment: the
        mapping and the descriptor ``mmap`` keeps go back at once.  An mmap cannot close while a numpy view of it
        exists, so the owners of views drop them first; if one is still held somewhere (an exception's frames),
        the mapping stays until that view dies, and this returns False."""
        self.unlink()
        self.array = None  # the view every other view derives from
        if self.mm is None or self.mm.closed:
            return True
        try:
            self.mm.close()
        except BufferError:
            return False
        return True


def unlink_name(name: str) -> None:
    try:
        os.unlink(os.path.join(SHM_DIR, name))
    except FileNotFoundError:
        pass


def sweep(tag: str) -> list[str]:
    """Remove every segment of one communicator (``nccllab-<tag>-*``); returns what was removed."""
    removed = []
    for name in os.listdir(SHM_DIR):
        if name.startswith(f"{PREFIX}{tag}-"):
            unlink_name(name)
            removed.append(name)
    return removed
