"""Branchy models for OWL: a sequence of bases, each base parallel branches of layers (Sec. 2.1, 4.1.1).

A base is what lies between two joins: its branches all read the base's input and the next base
reads their joined outputs, so the branches of a base may run in any order and a linear piece is
a base of one branch. Per layer: parameters and forward FLOPs per sample, computed from the
architecture (convolutions without bias, each followed by BatchNorm with its scale and shift;
2 FLOPs per multiply-add; pooling, BatchNorm and activations count no FLOPs).

- inception-v4: Szegedy et al. 2017, Fig. 3-9 (299 x 299 input, as timm's `inception_v4`): stem
  (its three joins are bases), 4 x Inception-A, Reduction-A, 7 x Inception-B, Reduction-B,
  3 x Inception-C, the classifier. OWL reports 42.68 M parameters; this profile has 42,679,816
  (1000 classes), the same to the digit.
- dfn: OWL's DFN [38] (a deep fusion network) is not described in the seed. Here it is a stand-in
  with the structure its name and the paper's use give, deeply-fused blocks (Wang et al. 2016): a
  deep path of three 3x3 convolutions and a shallow path of one, fused by a sum, two blocks in each
  of ResNet-18's four stages (64, 128, 256, 512 channels, 224 x 224 input), a strided 3x3
  convolution between stages. 27.16 M parameters against the paper's 25.41 M (+6.9 %).
- tiny: two small Inception-style blocks on 32 x 32 images (CIFAR-10), and mini-inception: Inception-v4's shape
  at that size: both train on a CPU (harness/workloads/fl/nets.py builds any chain-of-layers profile in PyTorch,
  the same parameters per layer, from the operations the builder records).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...compute import BYTES_PER_VALUE, conv_flop
from ..layers import Layer, LayerSums
from .federation import FLError

BYTES_PER_PARAM = BYTES_PER_VALUE["fp32"]  # OWL distributes fp32 parameters


@dataclass(frozen=True)
class Branch(LayerSums):
    layers: tuple[Layer, ...]
    # how each layer computes, for nets.py to build it: per layer its operations in order, a pooling before its
    # convolution included (("conv", cin, cout, kh, kw, stride, valid), ("pool", k, stride, valid), ("fc", cin,
    # cout)); `runnable` False where the branch is more than a chain of them (a pooling that ends it, a split)
    units: tuple[tuple[tuple, ...], ...] = field(default=(), compare=False, repr=False)
    runnable: bool = field(default=True, compare=False, repr=False)


@dataclass(frozen=True)
class Base:
    name: str
    branches: tuple[Branch, ...]
    join: str = "concat"  # how the branches' outputs meet: along channels, or summed (DFN's fusion)

    @property
    def params(self) -> int:
        return sum(b.params for b in self.branches)


@dataclass(frozen=True)
class BranchyModel:
    name: str
    bases: tuple[Base, ...]
    image: int  # input height = width

    @property
    def params(self) -> int:
        return sum(b.params for b in self.bases)

    @property
    def fwd_flop(self) -> float:
        return sum(br.fwd_flop for b in self.bases for br in b.branches)

    @property
    def layers(self) -> list[tuple[int, int, int]]:
        """(base, branch, layer) of every layer, in forward order."""
        return [(i, j, k) for i, b in enumerate(self.bases) for j, br in enumerate(b.branches)
                for k in range(len(br.layers))]


class _Builder:
    """Convolutions with BatchNorm on a running spatial size; `branch()` starts from the base's input."""

    def __init__(self, name: str, size: int, channels: int):
        self.name, self.size, self.channels = name, size, channels
        self.layers: list[Layer] = []
        self.units: list[tuple[tuple, ...]] = []
        self.pending: list[tuple] = []  # operations without parameters, computed with the next layer
        self.chain = True  # False once the branch stops being a chain of layers (_split)

    def conv(self, cout: int, kh: int, kw: int | None = None, stride: int = 1, valid: bool = False) -> "_Builder":
        kw = kh if kw is None else kw
        if valid:
            self.size = (self.size - max(kh, kw)) // stride + 1
        else:
            self.size = (self.size + stride - 1) // stride
        params = kh * kw * self.channels * cout + 2 * cout  # weights + BatchNorm scale and shift
        flop = conv_flop(self.channels, cout, kh, kw, self.size, self.size)
        self.layers.append(Layer(f"{self.name}.{len(self.layers)}", params, flop))
        self._unit(("conv", self.channels, cout, kh, kw, stride, valid))
        self.channels = cout
        return self

    def pool(self, stride: int = 1, valid: bool = False, k: int = 3) -> "_Builder":
        if stride > 1:
            self.size = (self.size - k) // stride + 1 if valid else (self.size + stride - 1) // stride
        self.pending.append(("pool", k, stride, valid))
        return self

    def fc(self, cout: int) -> "_Builder":
        self.layers.append(Layer(f"{self.name}.fc", self.channels * cout + cout, 2.0 * self.channels * cout))
        self._unit(("fc", self.channels, cout))
        self.channels = cout
        return self

    def _unit(self, op: tuple) -> None:
        self.units.append(tuple(self.pending) + (op,))
        self.pending = []

    def branch(self) -> Branch:
        return Branch(tuple(self.layers), tuple(self.units), self.chain and not self.pending)


class _Net:
    def __init__(self, size: int, channels: int):
        self.size, self.channels, self.bases = size, channels, []

    def base(self, name: str, *paths, join: str = "concat"):
        """paths: functions that build one branch each from a fresh _Builder on the base's input."""
        built = []
        for k, path in enumerate(paths):
            b = _Builder(f"{name}.b{k}", self.size, self.channels)
            path(b)
            built.append(b)
        sizes = {b.size for b in built}
        if len(sizes) != 1:
            raise AssertionError(f"{name}: branches end at different sizes {sizes}")
        self.size = sizes.pop()
        self.channels = (sum(b.channels for b in built) if join == "concat" else built[0].channels)
        branches = tuple(b.branch() for b in built)
        self.bases.append(Base(name, branches, join))

    def model(self, name: str, image: int) -> BranchyModel:
        return BranchyModel(name, tuple(self.bases), image)


def inception_v4(classes: int = 1000) -> BranchyModel:
    n = _Net(299, 3)
    n.base("stem.conv", lambda b: b.conv(32, 3, stride=2, valid=True).conv(32, 3, valid=True).conv(64, 3))
    n.base("stem.mixed3a", lambda b: b.pool(2, valid=True), lambda b: b.conv(96, 3, stride=2, valid=True))
    n.base("stem.mixed4a", lambda b: b.conv(64, 1).conv(96, 3, valid=True),
           lambda b: b.conv(64, 1).conv(64, 1, 7).conv(64, 7, 1).conv(96, 3, valid=True))
    n.base("stem.mixed5a", lambda b: b.conv(192, 3, stride=2, valid=True), lambda b: b.pool(2, valid=True))
    for i in range(4):
        n.base(f"inception_a{i}", lambda b: b.conv(96, 1), lambda b: b.conv(64, 1).conv(96, 3),
               lambda b: b.conv(64, 1).conv(96, 3).conv(96, 3), lambda b: b.pool().conv(96, 1))
    n.base("reduction_a", lambda b: b.conv(384, 3, stride=2, valid=True),
           lambda b: b.conv(192, 1).conv(224, 3).conv(256, 3, stride=2, valid=True),
           lambda b: b.pool(2, valid=True))
    for i in range(7):
        n.base(f"inception_b{i}", lambda b: b.conv(384, 1),
               lambda b: b.conv(192, 1).conv(224, 1, 7).conv(256, 7, 1),
               lambda b: b.conv(192, 1).conv(192, 7, 1).conv(224, 1, 7).conv(224, 7, 1).conv(256, 1, 7),
               lambda b: b.pool().conv(128, 1))
    n.base("reduction_b", lambda b: b.conv(192, 1).conv(192, 3, stride=2, valid=True),
           lambda b: b.conv(256, 1).conv(256, 1, 7).conv(320, 7, 1).conv(320, 3, stride=2, valid=True),
           lambda b: b.pool(2, valid=True))
    for i in range(3):
        # each split path (1x3 and 3x1 on one input) is its own layer of the branch; a branch's output
        # channels are what it joins with: 256 + 256 for the split ones
        n.base(f"inception_c{i}", lambda b: b.conv(256, 1),
               lambda b: _split(b.conv(384, 1), 256),
               lambda b: _split(b.conv(384, 1).conv(448, 3, 1).conv(512, 1, 3), 256),
               lambda b: b.pool().conv(256, 1))
    n.base("classifier", lambda b: b.fc(classes))
    return n.model("inception-v4", 299)


def _split(b: _Builder, cout: int) -> _Builder:
    b.chain = False  # two convolutions on one input, side by side: not a chain nets.py builds
    cin = b.channels
    b.conv(cout, 1, 3)
    b.channels = cin
    b.conv(cout, 3, 1)
    b.channels = 2 * cout
    return b


def dfn(classes: int = 1000) -> BranchyModel:
    n = _Net(224, 3)
    n.base("stem", lambda b: b.conv(64, 7, stride=2).pool(2))
    for s, c in enumerate((64, 128, 256, 512)):
        if s:
            n.base(f"down{s}", lambda b, c=c: b.conv(c, 3, stride=2))
        for k in range(2):
            n.base(f"fused{s}.{k}", lambda b, c=c: b.conv(c, 3).conv(c, 3).conv(c, 3),
                   lambda b, c=c: b.conv(c, 3), join="sum")
    n.base("classifier", lambda b: b.fc(classes))
    return n.model("dfn", 224)


def tiny(classes: int = 10) -> BranchyModel:
    n = _Net(32, 3)
    n.base("stem", lambda b: b.conv(16, 3))
    for i in range(2):
        n.base(f"block{i}", lambda b: b.conv(8, 1), lambda b: b.conv(8, 1).conv(16, 3),
               lambda b: b.conv(8, 1).conv(8, 3).conv(16, 3), lambda b: b.pool().conv(8, 1))
        n.base(f"down{i}", lambda b: b.conv(48, 3, stride=2))
    n.base("classifier", lambda b: b.fc(classes))
    return n.model("tiny", 32)


def mini_inception(classes: int = 10) -> BranchyModel:
    """Inception-v4's shape at CIFAR-10's size: three Inception-A blocks of four branches, a reduction, two
    Inception-B blocks with factorised 7x7 convolutions (0.50 M parameters, ten times tiny's): the largest branchy
    model the emulated cluster runs here."""
    n = _Net(32, 3)
    n.base("stem", lambda b: b.conv(32, 3))
    for i in range(3):
        n.base(f"inception_a{i}", lambda b: b.conv(32, 1), lambda b: b.conv(24, 1).conv(32, 3),
               lambda b: b.conv(24, 1).conv(32, 3).conv(32, 3), lambda b: b.pool().conv(32, 1))
    n.base("reduction", lambda b: b.conv(128, 3, stride=2))
    for i in range(2):
        n.base(f"inception_b{i}", lambda b: b.conv(64, 1), lambda b: b.conv(48, 1).conv(56, 1, 7).conv(64, 7, 1),
               lambda b: b.conv(48, 1).conv(48, 7, 1).conv(64, 1, 7), lambda b: b.pool().conv(64, 1))
    n.base("classifier", lambda b: b.fc(classes))
    return n.model("mini-inception", 32)


BRANCHY_MODELS = {"inception-v4": inception_v4, "dfn": dfn, "tiny": tiny, "mini-inception": mini_inception}


def get_branchy(name: str) -> BranchyModel:
    if name not in BRANCHY_MODELS:
        raise FLError(f"--model: unknown FL model {name!r} (known: {', '.join(BRANCHY_MODELS)})")
    model = BRANCHY_MODELS[name]()
    check(model)
    return model


def check(model: BranchyModel) -> None:
    """A model OWL can work on: bases of branches with parameters, at least one base with two branches."""
    if not model.bases or any(not b.branches for b in model.bases):
        raise FLError(f"{model.name}: a base with no branch")
    if all(len(b.branches) < 2 for b in model.bases):
        raise FLError(f"{model.name}: no base has two branches; OWL groups the branches of a nonlinear base")
