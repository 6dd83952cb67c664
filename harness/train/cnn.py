"""A small CNN of HetPipe's layer types a CPU trains in seconds, and images labelled by a fixed teacher.

HetPipe's convergence figures (Figs. 5-6) train VGG-19 and ResNet-152 on ImageNet; neither fits a CPU
emulation. `SmallResNet` keeps their layer types (convolutions, max-pooling, residual blocks with a
projection shortcut, a fully connected head) at a size a CPU process trains in milliseconds per
minibatch, as a chain of units (`UNITS`) that pipeline stages cut between, like GPT's blocks
(`stage(first, last)`). No BatchNorm: with weight stashing and minibatches of a few samples its running
statistics would differ per virtual worker and per stash; the residual branches start small instead.
Its layer profile (harness/workloads/cnn.py `small_resnet`) is computed from the same shapes, so the
planner and the compute model see what is trained.

Data (`teacher_batch`): images that mix fixed smooth patterns with random weights, plus pixel noise, each
labelled by a draw from softmax(teacher(x)), the teacher a fixed random CNN. The best expected
cross-entropy any model can reach is E_x[H(softmax(teacher(x)))] (`teacher_floor`); the student, far wider
than the teacher and seeing the same pixels, approaches it (plain SGD, batch 32: from log 10 = 2.30 to
within about 20 % of the floor in 300 steps). Everything depends only on (seed, iteration): every system
draws the identical batch.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..workloads.cnn import (SMALL_CLASSES as CLASSES, SMALL_IMAGE as IMAGE, SMALL_UNITS as UNITS,
                             SMALL_WIDTHS as WIDTHS)

FEATURE_SIDE = IMAGE[1] // 4  # after two 2 x 2 max-pools
TEACHER_WIDTH = 8
TEACHER_SEED = 7919  # the teacher's weights and the images' patterns: fixed, apart from the data's seed
#: an image is a random mix of this many fixed smooth patterns plus pixel noise: structure a network can
#: find in a few hundred steps (on pixel noise alone the teacher's labels are a needle in a haystack)
PATTERNS = 8
PATTERN_SIDE = 4  # each pattern is a 4 x 4 random image upsampled to 16 x 16
PIXEL_NOISE = 0.3
#: the teacher's logits are standardised over a reference sample and scaled to this spread: labels are
#: neither certain (floor near 0, nothing but memorising) nor noise (floor near log 10)
TEACHER_LOGIT_STD = 5.0
FLOOR_SAMPLES = 16384


def _conv(cin: int, cout: int) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, padding=1)


class Residual(nn.Module):
    """x + conv(relu(conv(x))), then ReLU; a 1 x 1 projection on the shortcut where the width changes."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv1, self.conv2 = _conv(cin, cout), _conv(cout, cout)
        self.shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        short = x if self.shortcut is None else self.shortcut(x)
        return F.relu(short + self.conv2(F.relu(self.conv1(x))))


class Stem(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = _conv(IMAGE[0], WIDTHS[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv(x))


class Pool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, 2)


class Head(nn.Module):
    """Flatten the last feature map and classify (VGG's head: the position of a feature counts)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(WIDTHS[1] * FEATURE_SIDE * FEATURE_SIDE, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.flatten(1))


def _units() -> list[nn.Module]:
    a, b = WIDTHS
    return [Stem(), Residual(a, a), Pool(), Residual(a, b), Pool(), Residual(b, b), Head()]


class SmallResNet(nn.Module):
    """The chain of UNITS; parameters initialised from `seed` alone (every process builds the same)."""

    def __init__(self, seed: int = 0):
        super().__init__()
        state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        self.units = nn.ModuleList(_units())
        for name, p in self.named_parameters():
            if ".conv2." in name and name.endswith("weight"):
                p.data.mul_(0.1)  # a residual branch starts near zero: the block starts near its shortcut
        torch.random.set_rng_state(state)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for u in self.units:
            x = u(x)
        return x

    def stage(self, first: int, last: int) -> nn.Module:
        """Units [first, last) as one module; its parameter names are `units.<k>...` with k counted in
        the stage (`unit_of` maps them back)."""
        return _Chain(list(self.units[first:last]))


class _Chain(nn.Module):
    def __init__(self, units: list[nn.Module]):
        super().__init__()
        self.units = nn.ModuleList(units)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for u in self.units:
            x = u(x)
        return x


def unit_of(name: str) -> int:
    """The unit a parameter of SmallResNet (or of a stage: then counted in the stage) belongs to."""
    return int(name.split(".")[1])


def activation_shape(unit: int, batch: int) -> tuple[int, ...]:
    """The output of unit `unit` (0-based) for `batch` images: what a stage that ends there sends."""
    net = _shapes()
    return (batch, *net[unit])


@lru_cache(maxsize=1)
def _shapes() -> tuple[tuple[int, ...], ...]:
    x = torch.zeros(1, *IMAGE)
    out = []
    with torch.no_grad():
        for u in _units():
            x = u(x)
            out.append(tuple(x.shape[1:]))
    return tuple(out)


class Teacher(nn.Module):
    """conv 3x3 -> ReLU -> 4 x 4 average pool -> fully connected: a position-dependent labelling."""

    def __init__(self):
        super().__init__()
        state = torch.random.get_rng_state()
        torch.manual_seed(TEACHER_SEED)
        self.conv = nn.Conv2d(IMAGE[0], TEACHER_WIDTH, 3, padding=1)
        self.fc = nn.Linear(TEACHER_WIDTH * FEATURE_SIDE * FEATURE_SIDE, CLASSES)
        torch.random.set_rng_state(state)
        g = torch.Generator().manual_seed(TEACHER_SEED)
        small = torch.randn(PATTERNS, IMAGE[0], PATTERN_SIDE, PATTERN_SIDE, generator=g)
        self.register_buffer("patterns", F.interpolate(small, size=IMAGE[1:], mode="bilinear", align_corners=False))
        with torch.no_grad():
            raw = self._raw(self.images(FLOOR_SAMPLES, g))
        self.register_buffer("mean", raw.mean(0))
        self.register_buffer("scale", TEACHER_LOGIT_STD / raw.std())

    def _raw(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(F.avg_pool2d(F.relu(self.conv(x)), 4).flatten(1))

    def images(self, n: int, g: torch.Generator) -> torch.Tensor:
        mix = torch.randn(n, PATTERNS, generator=g)
        return torch.einsum("np,pchw->nchw", mix, self.patterns) + PIXEL_NOISE * torch.randn(n, *IMAGE, generator=g)

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return (self._raw(x) - self.mean) * self.scale


@lru_cache(maxsize=1)
def teacher() -> Teacher:
    return Teacher()


def teacher_batch(batch: int, iteration: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(images (batch, 3, 16, 16), labels (batch,)) of `iteration`, from a seeded generator."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + iteration)
    x = teacher().images(batch, g)
    labels = torch.multinomial(F.softmax(teacher().logits(x), dim=1), 1, generator=g).squeeze(1)
    return x, labels


def teacher_floor(seed: int = 0) -> float:
    """E_x[H(softmax(teacher(x)))] in nats over FLOOR_SAMPLES fresh images (standard error ~ 0.005)."""
    g = torch.Generator().manual_seed(seed * 1_000_003 - 1)
    t = teacher()
    p = F.softmax(t.logits(t.images(FLOOR_SAMPLES, g)), dim=1)
    return float(-(p * torch.log(p.clamp_min(1e-30))).sum(1).mean())


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float(), labels)


def chance_loss() -> float:
    return math.log(CLASSES)
