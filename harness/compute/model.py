"""GPT configurations: shapes, parameter counts and how blocks split over stages.

What the shapes cost (FLOPs, bytes on the wire, seconds on a device) is harness/compute/.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import HarnessError


@dataclass(frozen=True)
class GPTConfig:
    name: str
    layers: int
    hidden: int
    heads: int
    seq: int  # sequence length of a sample, in tokens
    vocab: int = 50257  # GPT-2 BPE vocabulary, as GPT-3
    ffn_mult: int = 4  # MLP hidden = ffn_mult * hidden

    @property
    def block_params(self) -> int:
        """Parameters of one transformer block (attention, MLP, two LayerNorms)."""
        h, f = self.hidden, self.ffn_mult * self.hidden
        return (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h) + 4 * h

    @property
    def embedding_params(self) -> int:
        """Token + position embeddings (first stage)."""
        return self.vocab * self.hidden + self.seq * self.hidden

    @property
    def head_params(self) -> int:
        """Final LayerNorm + untied LM head (last stage)."""
        return 2 * self.hidden + self.vocab * self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.block_params + self.embedding_params + self.head_params


MODELS: dict[str, GPTConfig] = {
    # CPU configs for the emulated cluster; `tiny` trains an iteration in seconds on one core.
    "tiny": GPTConfig("tiny", layers=8, hidden=128, heads=4, seq=128, vocab=1024),
    # convergence on CPU ranks: a vocabulary the Markov data's chain (harness/workloads/markov.py) is learned
    # over in a few hundred SGD steps (tiny's 1024 tokens take thousands)
    "micro": GPTConfig("micro", layers=8, hidden=64, heads=4, seq=64, vocab=128),
    "small": GPTConfig("small", layers=8, hidden=256, heads=8, seq=256, vocab=4096),
    "medium": GPTConfig("medium", layers=8, hidden=512, heads=8, seq=512, vocab=8192),
    # GPT-3 family (Brown et al. 2020, Table 2.1). 13B uses h=5120 (heads divide it), as Megatron does.
    "gpt3-xl": GPTConfig("gpt3-xl", layers=24, hidden=2048, heads=16, seq=2048),
    "gpt3-6.7b": GPTConfig("gpt3-6.7b", layers=32, hidden=4096, heads=32, seq=2048),
    "gpt3-13b": GPTConfig("gpt3-13b", layers=40, hidden=5120, heads=40, seq=2048),
    # Sky Computing's model (Zhu et al. 2022, Sec. VI-B): BERT-Large's sizes (Devlin et al. 2019: 24 layers,
    # h=1024, 16 heads, 512 positions, 30522 WordPiece tokens), as a block stack of the same shape.
    "bert-large": GPTConfig("bert-large", layers=24, hidden=1024, heads=16, seq=512, vocab=30522),
}


class ModelError(HarnessError, ValueError):
    """Unknown model or bad layer count; str() is one line."""


def get_model(name: str, layers: int | None = None) -> GPTConfig:
    if name not in MODELS:
        raise ModelError(f"--model: unknown model {name!r} (known: {', '.join(MODELS)})")
    cfg = MODELS[name]
    if layers is not None:
        if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
            raise ModelError(f"--layers: must be a positive integer (got {layers!r})")
        cfg = replace(cfg, layers=layers)
    return cfg


def even_split(layers: int, d_pp: int) -> list[int]:
    """Contiguous split of `layers` blocks over d_pp stages (earlier stages take the remainder)."""
    if d_pp < 1 or d_pp > layers:
        raise ModelError(f"d_pp: {d_pp} stages cannot split {layers} layers")
    base, extra = divmod(layers, d_pp)
    return [base + (1 if j < extra else 0) for j in range(d_pp)]


def stage_layers(cfg: GPTConfig, d_pp: int) -> list[int]:
    """The even split of the model's blocks over d_pp stages."""
    return even_split(cfg.layers, d_pp)


def stage_params(cfg: GPTConfig, split: int | list[int]) -> list[int]:
    """Parameters of every stage: blocks, plus embeddings on the first, head on the last.
    split: the number of stages (even split) or the blocks of every stage (Layout.layers_per_stage)."""
    counts = [n * cfg.block_params for n in (stage_layers(cfg, split) if isinstance(split, int) else split)]
    counts[0] += cfg.embedding_params
    counts[-1] += cfg.head_params
    return counts
