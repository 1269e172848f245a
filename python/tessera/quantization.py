"""Bit packing of masks, FlashInfer-compatible (``flashinfer.packbits``, ``flashinfer.segment_packbits``).

Custom masks travel as bits: element ``i`` of a boolean array goes to bit ``i % 8`` of byte ``i // 8``
counted from the most significant bit (``bitorder="big"``, numpy's default) or from the least
(``"little"``, the order Tessera's kernels and FlashInfer's ``packed_custom_mask`` read). Both
functions run as torch operations on the input's device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Tuple

from . import _utils as U

if TYPE_CHECKING:
    import torch

__all__ = ["packbits", "segment_packbits"]


def _bit_weights(bitorder: Any, device: Any) -> "torch.Tensor":
    torch = U._torch()
    if bitorder not in ("big", "little"):
        raise ValueError(f"bitorder = {bitorder!r}, expected 'big' or 'little'")
    shifts = torch.arange(8, dtype=torch.int32, device=device)
    if bitorder == "big":
        shifts = 7 - shifts
    return torch.bitwise_left_shift(torch.ones(8, dtype=torch.int32, device=device), shifts)


def _as_bits(name: str, x: Any) -> "torch.Tensor":
    torch = U._torch()
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return (x.reshape(-1) != 0).to(torch.int32)


def packbits(x: "torch.Tensor", bitorder: str = "big") -> "torch.Tensor":
    """Packs the elements of ``x`` (flattened; nonzero = 1) into a uint8 tensor of
    ``ceil(x.numel() / 8)`` bytes on x's device, the last byte padded with zero bits.

    Args:
        x: any tensor, read as booleans.
        bitorder: ``"big"`` (element 8 i goes to the most significant bit of byte i) or ``"little"``.
    """
    torch = U._torch()
    bits = _as_bits("x", x)
    weights = _bit_weights(bitorder, bits.device)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    return (bits.view(-1, 8) * weights).sum(dim=1).to(torch.uint8)


def segment_packbits(x: "torch.Tensor", indptr: "torch.Tensor", bitorder: str = "big") -> Tuple["torch.Tensor", "torch.Tensor"]:
    """Packs each segment ``x[indptr[i]:indptr[i+1]]`` into its own bytes (as :func:`packbits`).

    Args:
        x: 1-D tensor, read as booleans.
        indptr: 1-D integer tensor ``[num_segments + 1]``, ``indptr[0] == 0``, non-decreasing,
            ``indptr[-1] == x.numel()``.
        bitorder: ``"big"`` or ``"little"``.

    Returns:
        ``(packed, packed_indptr)``: uint8 ``[packed_indptr[-1]]`` and int32 ``[num_segments + 1]``
        where segment i's bytes are ``packed[packed_indptr[i]:packed_indptr[i+1]]``, ``ceil(len_i / 8)``
        of them; both on x's device.
    """
    torch = U._torch()
    if not isinstance(x, torch.Tensor) or x.dim() != 1:
        raise ValueError(f"x must be a 1-D torch.Tensor, got {U._short(x)}")
    if not isinstance(indptr, torch.Tensor) or indptr.dim() != 1 or indptr.numel() < 1:
        raise ValueError(f"indptr must be a 1-D torch.Tensor of num_segments + 1 entries, got {U._short(indptr)}")
    if indptr.dtype.is_floating_point or indptr.dtype == torch.bool:
        raise TypeError(f"indptr.dtype = {indptr.dtype}, expected an integer dtype")
    weights = _bit_weights(bitorder, x.device)
    ip = indptr.to(device=x.device, dtype=torch.int64)
    lens = ip[1:] - ip[:-1]
    if int(ip[0]) != 0 or bool((lens < 0).any()) or int(ip[-1]) != x.numel():
        raise ValueError(
            f"indptr must start at 0, be non-decreasing and end at x.numel() = {x.numel()}; got first {int(ip[0])}, "
            f"last {int(ip[-1])}"
        )
    nbytes = (lens + 7) // 8
    packed_indptr = torch.zeros(ip.numel(), dtype=torch.int64, device=x.device)
    packed_indptr[1:] = torch.cumsum(nbytes, dim=0)
    total = int(packed_indptr[-1]) if packed_indptr.numel() > 0 else 0
    bits = _as_bits("x", x)
    # Element e of segment s sits at offset e - indptr[s]: byte packed_indptr[s] + offset // 8.
    seg = torch.repeat_interleave(torch.arange(lens.numel(), device=x.device), lens)
    offset = torch.arange(x.numel(), device=x.device) - ip[seg]
    byte = packed_indptr[seg] + offset // 8
    out = torch.zeros(total, dtype=torch.int32, device=x.device)
    out.index_add_(0, byte, bits * weights[offset % 8])
    return out.to(torch.uint8), packed_indptr.to(torch.int32)
