"""Helpers that import nothing of ours but ``tracing`` (NCCL ``src/misc/``): environment parameters
(``param.cc``), sockets and interfaces (``socket.cc``), shared-memory segments (``shmutils.cc``), and futex
sleeping (ours: ranks that outnumber cores must sleep, see ``futex.py``)."""
