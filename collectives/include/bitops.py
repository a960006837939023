"""NCCL ``src/include/bitops.h``'s integer helpers, for host and kernels alike (the GPU kernels compile this
``div_up`` as a device function)."""


def div_up(a: int, b: int) -> int:
    """``DIVUP``: ``a / b`` rounded up."""
    return (a + b - 1) // b


def round_up(a: int, b: int) -> int:
    """``ROUNDUP``: ``a`` rounded up to a multiple of ``b``."""
    return div_up(a, b) * b
