"""A GPT decoder a reader holds in their head (after nanoGPT), splittable into stages.

This file imports nothing from torch.distributed: pipeline, data-parallel and
baseline layouts are applied from outside (harness/train/*). `GPT.stage(a, b)`
returns the contiguous piece that one pipeline stage runs.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..compute.model import GPTConfig
from ..workloads.markov import DATA_SETS, markov_chain


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        # q, k, v and the output projection as separate Linears so that tensor parallel
        # can shard q/k/v by columns (heads) and the projection by rows.
        self.q = nn.Linear(cfg.hidden, cfg.hidden)
        self.k = nn.Linear(cfg.hidden, cfg.hidden)
        self.v = nn.Linear(cfg.hidden, cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # Head count follows the (possibly sharded) width: -1 keeps it right under tensor parallel.
        q, k, v = (t(x).view(B, T, -1, self.head_dim).transpose(1, 2) for t in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))

    @property
    def head_dim(self) -> int:
        return self.q.in_features // self.heads


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.hidden, cfg.ffn_mult * cfg.hidden)
        self.proj = nn.Linear(cfg.ffn_mult * cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embedding(nn.Module):
    """Token + learned position embeddings: tokens (B, T) -> hidden (B, T, h)."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(pos)


class Head(nn.Module):
    """Final LayerNorm + untied LM head: hidden -> logits."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln = nn.LayerNorm(cfg.hidden)
        self.out = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


class GPT(nn.Module):
    """embed -> blocks -> head. Parameters are initialised from `seed` alone, so every
    process (and every system) building the same config gets identical weights."""

    def __init__(self, cfg: GPTConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.embed = Embedding(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.head = Head(cfg)
        for name, p in self.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg.layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        torch.random.set_rng_state(gen_state)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(x)

    def stage(self, first: int, last: int) -> "Stage":
        """Blocks [first, last) as stage module; embeddings on stage 0, head on the last."""
        return Stage(
            embed=self.embed if first == 0 else None,
            blocks=list(self.blocks[first:last]),
            head=self.head if last == self.cfg.layers else None,
        )


class Stage(nn.Module):
    """One pipeline stage: tokens or hidden in, hidden or logits out."""

    def __init__(self, embed: nn.Module | None, blocks: list[nn.Module], head: nn.Module | None):
        super().__init__()
        self.embed = embed
        self.blocks = nn.ModuleList(blocks)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for b in self.blocks:
            x = b(x)
        if self.head is not None:
            x = self.head(x)
        return x


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all tokens of the batch."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def synthetic_batch(cfg: GPTConfig, batch: int, iteration: int, seed: int = 0,
                    data: str = "uniform") -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (batch, seq) and next-token targets for `iteration`, from a seeded generator.

    Every system draws the identical batch for the same (data, seed, iteration), and slices it by
    sample index for its own layout.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + iteration)
    if data == "markov":
        tokens = markov_chain(cfg.vocab, seed).sample(batch, cfg.seq + 1, g)
    elif data == "uniform":
        tokens = torch.randint(0, cfg.vocab, (batch, cfg.seq + 1), generator=g)
    else:
        raise ValueError(f"unknown data set {data!r} (known: {', '.join(DATA_SETS)})")
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_floor(cfg: GPTConfig, data: str, seed: int = 0) -> float:
    """The best expected next-token cross-entropy (nats) on `data`: log V for uniform tokens, the
    chain's entropy rate for the Markov chain."""
    return markov_chain(cfg.vocab, seed).entropy_rate if data == "markov" else math.log(cfg.vocab)
