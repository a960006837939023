"""NCCL ``src/include/bitops.h``'s integer helpers, for host and kernels alike (the GPU kernels compile this
``div_up`` as a device function)."""


def div_up(a: int, b: int) -> int:
    """``DIVUP``: ``a / b`` rounded up."""
    return (a + b - 1) // b


def round_up(a: int, b: int) -> int:
    """``ROUNDUP``: ``a`` rounded up to a multiple of ``b``."""
    return div_up(a, b) * b


def log2_up(x: int) -> int:
    """``log2Up``: the smallest ``n`` with ``2**n >= x`` (0 for 0 and 1)."""
    return (x - 1).bit_length() if x > 1 else 0


def pow2_up(x: int) -> int:
    """``pow2Up``: ``x`` rounded up to a power of two."""
    return 1 << log2_up(x)


def pow2_down(x: int) -> int:
    """``pow2Down``: the largest power of two not above ``x`` (``x`` > 0)."""
    return 1 << (x.bit_length() - 1)


def reverse_bits(x: int, nbits: int) -> int:
    """``reverseBits``: the low ``nbits`` bits of ``x`` in reverse order (the bits above them dropped)."""
    if nbits == 0:
        return 0
    low = x & ((1 << nbits) - 1)
    return int(f"{low:0{nbits}b}"[::-1], 2)


def u32fp_encode(x: int, bits_per_pow2: int) -> int:
    """``u32fpEncode``: ``x`` as a tiny float, the leading bit's position and the ``bits_per_pow2`` bits below it
    (the rest of ``x`` is dropped, so decoding rounds down)."""
    log2x = (x | 1).bit_length() - 1
    mantissa = (x >> (log2x - bits_per_pow2 if log2x >= bits_per_pow2 else 0)) & ((1 << bits_per_pow2) - 1)
    exponent = log2x - (bits_per_pow2 - 1) if log2x >= bits_per_pow2 else 0
    return exponent << bits_per_pow2 | mantissa


def u32fp_decode(x: int, bits_per_pow2: int) -> int:
    """``u32fpDecode``: the value ``u32fp_encode`` kept."""
    exponent = x >> bits_per_pow2
    mantissa = (x & ((1 << bits_per_pow2) - 1)) | ((1 << bits_per_pow2) if exponent else 0)
    return mantissa << (exponent - 1 if exponent else 0)


def u32fp8_encode(x: int) -> int:
    """``u32fp8Encode``: how a p2p work carries its chunk size in one byte."""
    return u32fp_encode(x, 3)


def u32fp8_decode(x: int) -> int:
    """``u32fp8Decode``."""
    return u32fp_decode(x, 3)
