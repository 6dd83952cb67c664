"""A compressed data-parallel exchange: the codec's settings, the bytes it puts on the wire, what it costs the device.

Ours' sharded parameter server (systems/ours/dp_sync.py) moves a stage's values in two phases: member i sends
shard k to its owner k, the owner reduces and sends the result back. Plain, the values are the gradients, summed.
Under a codec the exchange is CocktailSGD's: each replica first steps on its own gradient, then the replicas
average their parameter deltas from the last synced parameters (alike on every member), every message encoded; the
runtime's encoder is train/compression.py, and these formulas are what it sends, byte for byte (tests/test_wire.py).
Without compression, averaging the deltas of SGD-with-momentum steps is the synchronous step (both are linear in the
gradient); the codec's loss is what error feedback carries to the next exchange.

- `cocktail`: CocktailSGD (Wang et al., ICML 2023; DS3Lab/CocktailSGD, data_parallel/dist_dp_cocktail_sgd.py),
  named and defaulted as its code does (QUANT_BITS 8, QUANT_BUCKET_SIZE 128, TOPK_RATIO 0.5, RANDOMP_RATIO 0.5):
  of a shard's m values a random subset every member picks alike (every 1/randomp_ratio-th value, the subset rolled
  by one place each iteration: its `random_rolling`), of those the top-k by magnitude (topk_ratio, k cut to whole
  buckets) with a bit mask over the subset saying which, their values in `quant_bits` by buckets of
  `quant_bucket_size` sharing a max-magnitude scale. The owner decodes, averages, adds its server error and encodes
  the mean alike (same subset); error feedback on both sides as CocktailSGD keeps it (a replica's parameters keep
  what its message did not carry; the owner keeps its mean's).
  Three differences from its code. The subset is not cut to whole buckets: CocktailSGD's cut drops the last strided
  values, so a window of up to 2 x 127 values, moving one place a step, goes unsent for as many steps; in a model of
  billions that is nothing, in a small model's shard it is 2 % of the values, whose residual piles up for hundreds of
  steps, then sets its bucket's scale so high that the bucket's other values round to zero and pile up in turn (on
  a noisy quadratic with momentum SGD, 200 steps: 16x the plain run's error with the cut, as plain without it). The
  scales are fp32 (CocktailSGD's are fp16, of fp16 deltas; a bucket's largest delta of a small model's fp32
  parameters can fall below fp16's normal range). And the exchange is synchronous: CocktailSGD runs it beside the
  next step, one step stale.
- `int8`, `fp8`: every value quantized by buckets (int8: 8 bits as above; fp8: e4m3 scaled to its largest finite
  value, 448); no subset, no mask. Error feedback off unless asked (INTELLECT-1 sends int8 without it).

A codec is written `cocktail` or with settings, `cocktail:topk_ratio=0.1,quant_bits=4`; `none` is the plain
exchange, untouched.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ..errors import HarnessError

CODECS = ("none", "cocktail", "int8", "fp8")
QUANT_BITS = (2, 4, 8)  # packed whole into bytes
SCALE_BYTES = 4  # one fp32 scale per bucket
FP8_MAX = 448.0  # float8 e4m3's largest finite value

# The device's work, as passes over memory (a roofline at the device's memory bandwidth, like the optimizer step's):
# top-k is torch.topk's radix select, a pass of the subset per 8-bit digit of an fp32 key; a quantisation reads the
# values for the bucket's max, then reads them again and writes the codes; the delta and error feedback read the
# parameters and the synced copy and write both back; a decode reads the codes and the mask and adds into the sum.
TOPK_PASSES = 4
BYTES_PER_VALUE = 4  # fp32 gradients
QUANT_PASSES = 3
FEEDBACK_PASSES = 4
DECODE_PASSES = 2


class CompressionError(HarnessError, ValueError):
    """A codec setting that cannot run; str() is one line naming it."""


@dataclass(frozen=True)
class Compression:
    codec: str = "none"
    randomp_ratio: float = 0.5
    topk_ratio: float = 0.5
    quant_bits: int = 8
    quant_bucket_size: int = 128
    error_feedback: bool = True

    @classmethod
    def parse(cls, text: str, where: str = "--dp-compress") -> "Compression":
        """`codec[:name=value,...]`; int8 and fp8 quantize every value, without error feedback unless asked."""
        at = f"{where}: " if where else ""
        name, _, rest = str(text).partition(":")
        if name not in CODECS:
            raise CompressionError(f"{at}unknown codec {name!r} (known: {', '.join(CODECS)})")
        c = cls(name) if name == "cocktail" else cls(name, 1.0, 1.0, 8, 128, False)
        known = {f.name: f.type for f in fields(cls) if f.name != "codec"}
        for item in filter(None, rest.split(",")):
            key, eq, value = item.partition("=")
            if not eq or key not in known:
                raise CompressionError(f"{at}{item!r} is not one of {', '.join(f'{k}=VALUE' for k in known)}")
            if name == "none" or (name != "cocktail" and key in ("randomp_ratio", "topk_ratio", "quant_bits")):
                raise CompressionError(f"{at}{key} is not a setting of {name}")
            try:
                v = (value not in ("0", "false", "no")) if key == "error_feedback" else (
                    int(value) if key in ("quant_bits", "quant_bucket_size") else float(value))
            except ValueError:
                raise CompressionError(f"{at}{key}={value!r} is not a number") from None
            c = replace(c, **{key: v})
        c.check(where)
        return c

    def check(self, where: str = "--dp-compress") -> None:
        at = f"{where}: " if where else ""
        for key in ("randomp_ratio", "topk_ratio"):
            if not 0 < getattr(self, key) <= 1:
                raise CompressionError(f"{at}{key} must be in (0, 1] (got {getattr(self, key)})")
        if self.quant_bits not in QUANT_BITS:
            raise CompressionError(f"{at}quant_bits must be one of {QUANT_BITS} (got {self.quant_bits})")
        if self.quant_bucket_size < 1:
            raise CompressionError(f"{at}quant_bucket_size must be at least 1 (got {self.quant_bucket_size})")

    def __str__(self) -> str:
        """The canonical text: the codec and every setting that differs from its defaults."""
        base = Compression.parse(self.codec)
        diff = [f"{f.name}={int(v) if isinstance(v, bool) else v}" for f in fields(self)
                if f.name != "codec" and (v := getattr(self, f.name)) != getattr(base, f.name)]
        return self.codec + (":" + ",".join(diff) if diff else "")

    @property
    def off(self) -> bool:
        return self.codec == "none"

    # -- the encoding of one message of m values ------------------------------------------------------
    def subset_size(self, m: int) -> int:
        """Values of the random subset: every stride-th of m (stride = 1 / randomp_ratio, whole), all of them (module
        docstring: not cut to whole buckets)."""
        if self.randomp_ratio >= 1:
            return m
        return len(range(0, m, int(1 / self.randomp_ratio)))

    def kept(self, s: int) -> int:
        """Values of s that go: the top-k, k cut to whole buckets once it holds one (CocktailSGD's _compress)."""
        if self.topk_ratio >= 1:
            return s
        k = max(int(self.topk_ratio * s), 1)
        return k // self.quant_bucket_size * self.quant_bucket_size if k >= self.quant_bucket_size else k

    def buckets(self, k: int) -> int:
        return -(-k // self.quant_bucket_size)

    def message_bytes(self, m: int) -> int:
        """Bytes of one encoded message of m fp32 values: the mask (top-k only), the codes, the scales."""
        if self.off:
            return BYTES_PER_VALUE * m
        s = self.subset_size(m)
        k = self.kept(s)
        bits = 8 if self.codec == "fp8" else self.quant_bits
        mask = -(-s // 8) if k < s else 0  # no mask where every value of the subset goes
        return mask + -(-k * bits // 8) + SCALE_BYTES * self.buckets(k)

    def sent_bytes(self, numel: int, members: int, me: int = 0) -> int:
        """Bytes member `me` sends in one sync of `numel` values over `members`: each other member's shard to
        it (the scatter), and its own shard's sum to every other member (the gather)."""
        if members < 2:
            return 0
        sizes = shard_sizes(numel, members)
        return (sum(self.message_bytes(x) for j, x in enumerate(sizes) if j != me)
                + (members - 1) * self.message_bytes(sizes[me]))

    def shard_bytes(self, numel: int, members: int) -> float:
        """The gradient bytes a plain exchange would carry to send what this codec sends (the simulator's
        sharded-PS message is gradient bytes / members): members x the largest shard's message."""
        return float(members * self.message_bytes(shard_sizes(numel, members)[0]))

    def c_dp(self, grad_bytes: float, bytes_per_value: int, members: int) -> float:
        """The cost model's C_DP (a stage's gradient bytes, eq. 2) for an exchange under this codec: the plain
        bytes whose shards weigh what its messages do, so the scheduler places for what goes on the wire."""
        if self.off:
            return grad_bytes
        return self.shard_bytes(round(grad_bytes / bytes_per_value), members)

    # -- the device's work -----------------------------------------------------------------------------
    def device_bytes(self, numel: int, members: int) -> tuple[float, float]:
        """Memory traffic of one member's codec work in one sync: (before its first message goes: encoding every
        shard of its gradient, with error feedback; after: decoding the others' shards of its own, encoding their
        sum once (the owner) and decoding every sum (the gather))."""
        if self.off or members < 2:
            return 0.0, 0.0
        m = shard_sizes(numel, members)[0]
        s, k = self.subset_size(m), self.kept(self.subset_size(m))
        feedback = FEEDBACK_PASSES * m if self.error_feedback else 0
        encode = BYTES_PER_VALUE * (feedback + (TOPK_PASSES * s if k < s else 0) + QUANT_PASSES * k)
        decode = BYTES_PER_VALUE * DECODE_PASSES * m
        return members * encode, encode + (2 * members - 1) * decode

    def device_seconds(self, numel: int, members: int, memory_bandwidth_gbs: float | None, slowdown: float = 1.0
                       ) -> tuple[float, float]:
        """device_bytes at the device's memory bandwidth (0 where the scenario gives none: not modelled)."""
        if not memory_bandwidth_gbs:
            return 0.0, 0.0
        rate = memory_bandwidth_gbs * 1e9 / slowdown
        before, after = self.device_bytes(numel, members)
        return before / rate, after / rate


NONE = Compression()


def shard_sizes(numel: int, members: int) -> list[int]:
    """The sharded parameter server's shards of `numel` values (torch's tensor_split: the first numel % members
    hold one more)."""
    q, r = divmod(numel, members)
    return [q + (j < r) for j in range(members)]

