"""Parallel layouts of the baselines: degrees, ZeRO stage, schedule and rank order, validated once.

A layout is what `RunSpec.layout` carries for `megatron` and `deepspeed`:
- megatron: {"tp", "pp", "dp", "schedule", "rank_order"}; rank_order[k] is the device
  (process rank) that plays Megatron's logical rank k. Logical ranks are numbered as
  Megatron numbers them, tensor-parallel fastest, then data-parallel, pipeline slowest
  (k = (stage * dp + replica) * tp + shard). "default" is the identity; the paper's
  random layouts are permutations from seeds 2022, 2023, 2024.
- deepspeed: {"zero": 3} (FSDP over every device) or {"zero": 1, "pp", "dp", "schedule"}
  (ZeRO-1 data parallel around a pipeline, DeepSpeed's PipeDataParallelTopology order).

The degrees' product must equal the device count, and the model must allow them
(heads and the MLP width divisible by D_TP, layers by D_PP).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import HarnessError
from ...model import GPTConfig

DEGREES = (1, 2, 4, 8)  # the paper's grid (appendix D.2)
SCHEDULE_NAMES = ("gpipe", "1f1b")
RANDOM_LAYOUT_SEEDS = (2022, 2023, 2024)  # appendix D.1


class LayoutError(HarnessError, ValueError):
    """A layout the devices or the model cannot run; str() is one line."""


@dataclass(frozen=True)
class Layout:
    """One baseline configuration. zero: 0 = DDP (Megatron), 1 = ZeRO-1 optimizer, 3 = FSDP."""

    tp: int
    pp: int
    dp: int
    zero: int = 0
    schedule: str = "1f1b"
    rank_order: tuple[int, ...] = ()  # empty = default (identity)

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    def order(self) -> tuple[int, ...]:
        """rank_order with each tensor-parallel group's ranks ascending.

        A process group numbers its members by global rank and DTensor gives shard i to
        member i, whatever the mesh says; sorting inside each TP group makes the mesh
        coordinate equal that shard index, so data-parallel and pipeline peers hold the same
        shard. Which devices form a group (what a layout decides) is unchanged.
        """
        order = self.rank_order or tuple(range(self.devices))
        return tuple(r for k in range(0, len(order), self.tp) for r in sorted(order[k:k + self.tp]))

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(stage, replica, shard) of process `rank`."""
        k = self.order().index(rank)
        return k // (self.dp * self.tp), (k // self.tp) % self.dp, k % self.tp

    def mesh_ranks(self) -> np.ndarray:
        """Process ranks as a (pp, dp, tp) array: the device mesh of this layout."""
        return np.asarray(self.order(), dtype=np.int64).reshape(self.pp, self.dp, self.tp)

    def to_json(self) -> dict:
        """The record's `config` field and RunSpec.layout for this layout."""
        if self.zero == 3:
            return {"zero": 3, "dp": self.dp}
        out = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "schedule": self.schedule}
        if self.zero == 1:
            out = {"zero": 1, "pp": self.pp, "dp": self.dp, "schedule": self.schedule}
        if self.rank_order and self.rank_order != tuple(range(self.devices)):
            out["rank_order"] = list(self.rank_order)
        return out

    def label(self) -> str:
        if self.zero == 3:
            return f"zero3 dp={self.dp}"
        head = f"zero1 pp={self.pp} dp={self.dp}" if self.zero == 1 else f"tp={self.tp} pp={self.pp} dp={self.dp}"
        return head + f" {self.schedule}"


def validate(layout: Layout, cfg: GPTConfig, devices: int, batch: int, micro_batch: int) -> Layout:
    """Check the layout against devices, model and batch; returns it or raises LayoutError."""
    for name in ("tp", "pp", "dp"):
        v = getattr(layout, name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise LayoutError(f"layout.{name}: must be a positive integer (got {v!r})")
    if layout.devices != devices:
        raise LayoutError(
            f"layout: tp*pp*dp = {layout.tp}*{layout.pp}*{layout.dp} = {layout.devices} != {devices} devices"
        )
    if layout.zero not in (0, 1, 3):
        raise LayoutError(f"layout.zero: must be 1 or 3 (got {layout.zero!r})")
    if layout.zero == 3 and (layout.tp != 1 or layout.pp != 1):
        raise LayoutError("layout.zero: ZeRO-3 runs without tensor or pipeline parallelism (tp = pp = 1)")
    if layout.zero == 1 and layout.tp != 1:
        raise LayoutError("layout.zero: ZeRO-1 + pipeline runs without tensor parallelism (tp = 1)")
    if layout.schedule not in SCHEDULE_NAMES:
        raise LayoutError(f"layout.schedule: must be one of {', '.join(SCHEDULE_NAMES)} (got {layout.schedule!r})")
    if cfg.heads % layout.tp or (cfg.ffn_mult * cfg.hidden) % layout.tp:
        raise LayoutError(f"layout.tp: {layout.tp} does not divide the {cfg.heads} heads of model {cfg.name}")
    if cfg.layers % layout.pp:
        raise LayoutError(f"layout.pp: {layout.pp} does not divide the {cfg.layers} layers of model {cfg.name}")
    if batch % layout.dp or (batch // layout.dp) % micro_batch:
        raise LayoutError(
            f"layout.dp: batch {batch} does not split into {layout.dp} replicas of whole micro-batches of {micro_batch}"
        )
    if layout.rank_order and sorted(layout.rank_order) != list(range(devices)):
        raise LayoutError(f"layout.rank_order: must be a permutation of 0..{devices - 1} (got {list(layout.rank_order)})")
    return layout


def random_rank_order(devices: int, seed: int, tp: int = 1, pp: int = 1) -> tuple[int, ...]:
    """The paper's random layout for a (tp, pp, devices / (tp*pp)) layout.

    The same seeded permutation as ours-random's assignment (experiment.place:
    `default_rng(seed).permutation(n)` read replica-major, `pipelines[i][j] = perm[i*pp + j]`),
    extended by the shard index: so with tp = 1 and the same D_PP x D_DP, Megatron runs on
    exactly the random layout ours-random ran on, as in the paper (appendix D.2).
    """
    perm = np.random.default_rng(seed).permutation(devices)
    dp = devices // (tp * pp)
    order = [0] * devices
    for j in range(pp):
        for i in range(dp):
            for t in range(tp):
                order[(j * dp + i) * tp + t] = int(perm[(i * pp + j) * tp + t])
    return tuple(order)


def from_json(system: str, layout: dict, devices: int) -> Layout:
    """Parse RunSpec.layout for `system` (megatron | deepspeed); ZeRO-3 spans all `devices`."""
    if not isinstance(layout, dict):
        raise LayoutError(f"layout: must be a mapping (got {layout!r})")
    if system == "megatron":
        known = {"tp", "pp", "dp", "schedule", "rank_order"}
        _reject_unknown(layout, known)
        for name in ("tp", "pp", "dp"):
            if name not in layout:
                raise LayoutError(f"layout.{name}: missing for megatron (needs tp, pp, dp)")
        return Layout(
            tp=layout["tp"], pp=layout["pp"], dp=layout["dp"], zero=0,
            schedule=layout.get("schedule", "1f1b"), rank_order=tuple(layout.get("rank_order") or ()),
        )
    if system == "deepspeed":
        known = {"zero", "pp", "dp", "schedule", "rank_order"}
        _reject_unknown(layout, known)
        zero = layout.get("zero")
        if zero == 3:
            if layout.get("pp", 1) != 1:
                raise LayoutError(f"layout.pp: ZeRO-3 runs without pipeline (got pp={layout['pp']})")
            return Layout(tp=1, pp=1, dp=layout.get("dp", devices), zero=3, rank_order=tuple(layout.get("rank_order") or ()))
        if zero == 1:
            for name in ("pp", "dp"):
                if name not in layout:
                    raise LayoutError(f"layout.{name}: missing for deepspeed ZeRO-1 (needs pp, dp)")
            return Layout(
                tp=1, pp=layout["pp"], dp=layout["dp"], zero=1,
                schedule=layout.get("schedule", "1f1b"), rank_order=tuple(layout.get("rank_order") or ()),
            )
        raise LayoutError(f"layout.zero: must be 1 or 3 for deepspeed (got {zero!r})")
    raise LayoutError(f"system: {system!r} is not a baseline (megatron | deepspeed)")


def _reject_unknown(layout: dict, known: set[str]) -> None:
    unknown = sorted(set(layout) - known)
    if unknown:
        raise LayoutError(f"layout: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")


def megatron_grid(cfg: GPTConfig, devices: int, batch: int, micro_batch: int) -> list[Layout]:
    """Every (D_TP, D_PP, D_DP) in {1,2,4,8}^3 with product = devices that the model and batch allow."""
    out = []
    for tp in DEGREES:
        for pp in DEGREES:
            for dp in DEGREES:
                if tp * pp * dp != devices:
                    continue
                try:
                    out.append(validate(Layout(tp, pp, dp), cfg, devices, batch, micro_batch))
                except LayoutError:
                    continue
    return out


def deepspeed_grid(cfg: GPTConfig, devices: int, batch: int, micro_batch: int) -> list[Layout]:
    """ZeRO-3 over all devices, and ZeRO-1 + pipeline for every (D_PP, D_DP) the model allows."""
    candidates = [Layout(1, 1, devices, zero=3)]
    candidates += [Layout(1, pp, devices // pp, zero=1) for pp in DEGREES if devices % pp == 0 and pp > 1]
    out = []
    for lay in candidates:
        try:
            out.append(validate(lay, cfg, devices, batch, micro_batch))
        except LayoutError:
            continue
    return out


def layout_from_flags(
    system: str, cfg: GPTConfig, devices: int, batch: int, micro_batch: int, *,
    tp: int | None = None, pp: int | None = None, dp: int | None = None, zero: int | None = None,
    schedule: str = "1f1b", ranks: str = "default",
) -> dict:
    """RunSpec.layout from `harness run` flags (--tp --pp --dp | --zero 1|3, --schedule, --rank-order).

    Missing degrees are filled so the product is `devices` (megatron: dp, then pp; ZeRO-1:
    dp). ranks: "default" (rank order) or an integer seed of a random layout (2022, ...).
    """
    if system == "megatron":
        if zero is not None:
            raise LayoutError("--zero: only for --system deepspeed")
        tp = tp or 1
        pp = pp or (devices // (tp * dp) if dp else 1)
        dp = dp or devices // (tp * pp)
        lay = Layout(tp, pp, dp, zero=0, schedule=schedule)
    elif system == "deepspeed":
        if tp not in (None, 1):
            raise LayoutError("--tp: DeepSpeed-style runs have no tensor parallelism (use --system megatron)")
        if zero not in (1, 3):
            raise LayoutError(f"--zero: must be 1 or 3 for --system deepspeed (got {zero!r})")
        if zero == 3:
            if pp not in (None, 1):
                raise LayoutError(f"--pp: ZeRO-3 runs without pipeline (got {pp})")
            lay = Layout(1, 1, devices, zero=3, schedule=schedule)
        else:
            pp = pp or (devices // dp if dp else devices)
            dp = dp or devices // pp
            lay = Layout(1, pp, dp, zero=1, schedule=schedule)
    else:
        raise LayoutError(f"--system: {system!r} is not a baseline (megatron | deepspeed)")
    if ranks != "default":
        try:
            seed = int(ranks)
        except ValueError:
            raise LayoutError(f"--rank-order: must be default or an integer seed (got {ranks!r})") from None
        lay = Layout(lay.tp, lay.pp, lay.dp, lay.zero, lay.schedule, random_rank_order(devices, seed, lay.tp, lay.pp))
    return validate(lay, cfg, devices, batch, micro_batch).to_json()


def degrees(system: str, layout: dict, devices: int) -> tuple[int, int, int]:
    """(D_TP, D_PP, D_DP) of a baseline's RunSpec.layout, for the records."""
    lay = from_json(system, layout, devices)
    return lay.tp, lay.pp, lay.dp


def plan_layout(system: str, cfg: GPTConfig, devices: int, batch: int, micro_batch: int, *,
                layout: dict | None = None, **flags) -> tuple[dict, tuple[int, int, int]]:
    """What `harness run` needs for a baseline, in one call: the validated RunSpec.layout (given
    as `layout`, e.g. by `harness tune`, or built from the run flags of `layout_from_flags`)
    and its (D_TP, D_PP, D_DP) for the records. Raises LayoutError (one line) in the parent,
    before any rank starts."""
    if layout:
        lay = validate(from_json(system, layout, devices), cfg, devices, batch, micro_batch)
        return lay.to_json(), (lay.tp, lay.pp, lay.dp)
    out = layout_from_flags(system, cfg, devices, batch, micro_batch, **flags)
    return out, degrees(system, out, devices)
