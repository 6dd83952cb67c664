"""A learnable synthetic token stream whose loss floor is known: a fixed random Markov chain.

Why: on uniform random tokens every model's loss stays at log V, so they cannot show one system
converging faster than another. Tokens from a first-order Markov chain can be learned, and the best
expected next-token cross-entropy any model can reach is the chain's entropy rate
H = -sum_i pi_i sum_j P_ij log P_ij (nats), pi its stationary distribution. Sequences start in pi, so
every position of every sequence has that floor, whatever the model sees before it.

The chain: each token has `successors` possible next tokens with Dirichlet(1) weights (about 1.7 nats
for 8 of them, far below log V); token i + 1 (mod V) is always one of them, so the chain is irreducible
and pi unique. It depends only on (vocab, seed, successors): every system of one comparison draws from
the same chain.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
import torch

#: The synthetic data sets of GPT training (`--data`): uniform random tokens (nothing to learn: the loss
#: stays at log V; throughput does not depend on the text) or this chain.
DATA_SETS = ("uniform", "markov")
SUCCESSORS = 8
#: pi is the lazy chain's fixed point, iterated until its L1 change is below this.
STATIONARY_TOLERANCE = 1e-13
STATIONARY_MAX_STEPS = 100_000


@dataclass(frozen=True, eq=False)
class MarkovChain:
    successors: np.ndarray  # (V, K) token ids
    probs: np.ndarray  # (V, K) transition probabilities, rows sum to 1
    stationary: np.ndarray  # (V,)

    @property
    def vocab(self) -> int:
        return len(self.stationary)

    @property
    def entropy_rate(self) -> float:
        """The loss floor: expected -log P(next | current) in nats, the current token drawn from pi."""
        p = self.probs
        row = -(p * np.log(np.where(p > 0, p, 1.0))).sum(axis=1)
        return float(self.stationary @ row)

    @cached_property
    def _tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """pi, successors and each row's cumulative probabilities as tensors, made once per chain."""
        cum = torch.from_numpy(np.cumsum(self.probs, axis=1))
        cum[:, -1] = 1.0  # no u in [0, 1) falls past the last successor
        return torch.from_numpy(self.stationary), torch.from_numpy(self.successors), cum

    def sample(self, batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
        """(batch, length) token ids: the first from pi, each next from its row of the chain."""
        pi, succ, cum = self._tables
        out = torch.empty(batch, length, dtype=torch.long)
        cur = torch.multinomial(pi, batch, replacement=True, generator=generator)
        out[:, 0] = cur
        for t in range(1, length):
            u = torch.rand(batch, 1, dtype=torch.float64, generator=generator)
            k = torch.searchsorted(cum[cur], u, right=True).squeeze(1)
            cur = succ[cur, k]
            out[:, t] = cur
        return out


@lru_cache(maxsize=8)
def markov_chain(vocab: int, seed: int = 0, successors: int = SUCCESSORS) -> MarkovChain:
    """The chain of (vocab, seed): built from numpy's seeded generator, the same on every host."""
    if vocab < 2:
        raise ValueError(f"a Markov chain needs at least 2 tokens (got {vocab})")
    k = min(successors, vocab)
    rng = np.random.default_rng([vocab, seed, k])
    succ = np.empty((vocab, k), dtype=np.int64)
    for i in range(vocab):
        others = rng.choice(np.delete(np.arange(vocab), (i + 1) % vocab), size=k - 1, replace=False)
        succ[i] = np.concatenate([[(i + 1) % vocab], others])
    probs = rng.dirichlet(np.ones(k), size=vocab)
    return MarkovChain(succ, probs, _stationary(succ, probs))


def _stationary(succ: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """pi = pi P by iterating the lazy chain (P + I) / 2: same pi, aperiodic, so it converges."""
    v = len(succ)
    pi = np.full(v, 1.0 / v)
    flat = succ.ravel()
    for _ in range(STATIONARY_MAX_STEPS):
        moved = np.bincount(flat, weights=(pi[:, None] * probs).ravel(), minlength=v)
        nxt = 0.5 * (pi + moved)
        nxt /= nxt.sum()
        if np.abs(nxt - pi).sum() < STATIONARY_TOLERANCE:
            return nxt
        pi = nxt
    raise RuntimeError(f"the stationary distribution of a {v}-token chain did not converge")  # a bug
