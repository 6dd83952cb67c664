"""The codecs of a compressed data-parallel exchange, in torch: a message of a shard's fp32 values to bytes and
back, as compute/compression.py defines them (its docstring: CocktailSGD's random subset, top-k and n-bit buckets;
int8; fp8), and the error feedback each side carries.

A message is one uint8 tensor: the top-k mask over the subset (1 bit a value), the codes (`quant_bits` a value, or
fp8's byte), the fp32 scales; its length is `Compression.message_bytes(m)`, so a receiver posts its buffer before
the message is made. Encoding also returns what the message decodes to, which is what the sender carries in
its residual and what the owner takes as its own contribution, so every member ends with the same values.
"""
from __future__ import annotations

import torch

from ..compute.compression import FP8_MAX, Compression

_BIT_WEIGHTS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """A bool vector as bytes, 8 to a byte (low bit first), the tail padded with zeros."""
    padded = torch.zeros(-(-mask.numel() // 8) * 8, dtype=torch.uint8, device=mask.device)
    padded[:mask.numel()] = mask.to(torch.uint8)
    return (padded.view(-1, 8) * _BIT_WEIGHTS.to(mask.device)).sum(1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    return (packed[:, None] & _BIT_WEIGHTS.to(packed.device)).ne(0).view(-1)[:n]


def _pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes below 2**bits, 8 // bits to a byte."""
    if bits == 8:
        return codes
    per = 8 // bits
    padded = torch.zeros(-(-codes.numel() // per) * per, dtype=torch.uint8, device=codes.device)
    padded[:codes.numel()] = codes
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=codes.device)
    return (padded.view(-1, per) << shifts).sum(1, dtype=torch.uint8)


def _unpack_codes(packed: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    if bits == 8:
        return packed[:n]
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    return ((packed[:, None] >> shifts) & (2 ** bits - 1)).view(-1)[:n]


class ShardCodec:
    """Messages of m values under `c`: the rolling subset (shared by every member, moved one place an
    iteration), top-k, quantisation by buckets."""

    def __init__(self, c: Compression, m: int, device=None):
        self.c, self.m = c, m
        self.s = c.subset_size(m)
        self.k = c.kept(self.s)
        self.bits = 8 if c.codec == "fp8" else c.quant_bits
        stride = 1 if self.s == m else int(1 / c.randomp_ratio)
        self.base = torch.arange(0, m, stride, device=device)[:self.s]
        self.mask_bytes = -(-self.s // 8) if self.k < self.s else 0
        self.code_bytes = -(-self.k * self.bits // 8)
        self.bytes = c.message_bytes(m)

    def positions(self, iteration: int) -> torch.Tensor:
        """The subset at this iteration: CocktailSGD's mask rolled by one place each step."""
        return self.base if self.s == self.m else (self.base + iteration) % self.m

    def encode(self, x: torch.Tensor, iteration: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(the message, the m values it decodes to)."""
        pos = self.positions(iteration)
        sub = x[pos]
        if self.k < self.s:
            keep = torch.zeros(self.s, dtype=torch.bool, device=x.device)
            keep[torch.topk(sub.abs(), self.k, sorted=False).indices] = True
            values, sent_at, mask = sub[keep], pos[keep], pack_bits(keep)
        else:
            values, sent_at, mask = sub, pos, x.new_empty(0, dtype=torch.uint8)
        codes, scales, decoded = self._quantize(values)
        out = torch.zeros_like(x)
        out[sent_at] = decoded
        return torch.cat([mask, codes, scales.view(torch.uint8)]), out

    def decode(self, msg: torch.Tensor, iteration: int) -> torch.Tensor:
        pos = self.positions(iteration)
        mask, codes = msg[:self.mask_bytes], msg[self.mask_bytes:self.mask_bytes + self.code_bytes]
        scales = msg[self.mask_bytes + self.code_bytes:].clone().view(torch.float32)
        at = pos[unpack_bits(mask, self.s)] if self.k < self.s else pos
        out = torch.zeros(self.m, dtype=torch.float32, device=msg.device)
        out[at] = self._dequantize(codes, scales)
        return out

    def _buckets(self, values: torch.Tensor) -> torch.Tensor:
        b = self.c.quant_bucket_size
        padded = values.new_zeros(self.c.buckets(self.k) * b)
        padded[:self.k] = values
        return padded.view(-1, b)

    def _quantize(self, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        blocks = self._buckets(values)
        scale = blocks.abs().amax(dim=1)
        safe = scale.clamp_min(torch.finfo(torch.float32).tiny)[:, None]
        if self.c.codec == "fp8":
            f8 = (blocks / safe * FP8_MAX).to(torch.float8_e4m3fn)
            codes = f8.view(torch.uint8).view(-1)[:self.k]
            decoded = (f8.float() / FP8_MAX * safe).view(-1)[:self.k]
            return codes, scale, decoded
        levels = 2 ** (self.bits - 1) - 1
        q = torch.round(blocks / safe * levels).clamp_(-levels, levels)
        decoded = (q / levels * safe).view(-1)[:self.k]
        codes = (q.view(-1)[:self.k] + levels).to(torch.uint8)  # offset: unsigned codes
        return _pack_codes(codes, self.bits), scale, decoded

    def _dequantize(self, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
        b = self.c.quant_bucket_size
        n = self.c.buckets(self.k) * b
        if self.c.codec == "fp8":
            padded = torch.zeros(n, dtype=torch.uint8, device=codes.device)
            padded[:self.k] = codes
            return (padded.view(torch.float8_e4m3fn).float().view(-1, b) / FP8_MAX
                    * scales.clamp_min(torch.finfo(torch.float32).tiny)[:, None]).view(-1)[:self.k]
        levels = 2 ** (self.bits - 1) - 1
        q = torch.zeros(n, dtype=torch.float32, device=codes.device)
        q[:self.k] = _unpack_codes(codes, self.bits, self.k).float() - levels
        safe = scales.clamp_min(torch.finfo(torch.float32).tiny)[:, None]
        return (q.view(-1, b) / levels * safe).view(-1)[:self.k]


class ErrorFeedback:
    """What a sender did not send, added to its next message of the same values (off: nothing carried)."""

    def __init__(self, on: bool):
        self.on = on
        self.residual: torch.Tensor | None = None

    def add(self, x: torch.Tensor) -> torch.Tensor:
        if not self.on or self.residual is None or self.residual.shape != x.shape:
            return x
        return x + self.residual

    def keep(self, wanted: torch.Tensor, sent: torch.Tensor) -> None:
        if self.on:
            self.residual = wanted - sent
