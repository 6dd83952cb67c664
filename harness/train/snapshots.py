"""What each device holds after every iteration, kept in its own memory, so that when a device is preempted
the survivors go on from the last iteration they completed, not from the last checkpoint: what a stage lost in
one replica is copied from another replica's memory over the links (ours' recovery, plan/systems recovery
"replan", under the emulated cluster's elastic agent, train/elastic.py).

Each rank of a generation writes its items (by full GPT parameter name: value and SGD momentum) after each
iteration to <root>/device-<d>/g<generation>-iter-<k>.pt, atomically, on the node's tmpfs, and keeps the last
KEEP: when a device goes, the survivors are at most one iteration apart (to finish iteration k a rank needs
every rank to have done its forward of k, so every rank has finished k - 1), so one of the last two is an
iteration every survivor has. The agent forgets a preempted device's files (the machine took its memory) and
picks the last iteration every item of the new layout survived in (`recovery_plan`; from the generation before
when the last one was stopped before its ranks kept anything); each rank of the next
generation then takes what its device held and receives the rest from the holder with the fastest link
(systems/ours/replan.exchange). Where no survivor holds some item, the run goes on from its last checkpoint.
The generation in the name keeps an earlier layout's files apart from the one the agent reads.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..layout import Layout
from ..layout.holdings import holdings, item_from_key, item_key, sources_of

KEEP = 2
_NAME = re.compile(r"g(\d+)-iter-(\d+)\.pt")


def device_dir(root, device: int) -> Path:
    return Path(root) / f"device-{device}"


def save(root, device: int, generation: int, iteration: int, held: dict) -> None:
    """Device `device`'s items after `iteration` iterations (name -> (value, momentum)) in `generation`; the
    device's older files (and an earlier generation's) go."""
    where = device_dir(root, device)
    where.mkdir(parents=True, exist_ok=True)
    tmp = where / ".snapshot.tmp"
    torch.save({n: (v.detach().float().cpu(), m.detach().float().cpu()) for n, (v, m) in held.items()}, tmp)
    os.replace(tmp, where / f"g{generation}-iter-{iteration}.pt")
    for g, k in saved(root, device):
        if g != generation or k <= iteration - KEEP:
            (where / f"g{g}-iter-{k}.pt").unlink(missing_ok=True)


def saved(root, device: int) -> list[tuple[int, int]]:
    """(generation, iteration) of the device's files."""
    where = device_dir(root, device)
    if not where.is_dir():
        return []
    return sorted((int(m[1]), int(m[2])) for p in where.iterdir() if (m := _NAME.fullmatch(p.name)))


def load(root, device: int, generation: int, iteration: int) -> dict:
    """name -> (value, momentum) the device held after `iteration` in `generation`; {} when it has no file."""
    path = device_dir(root, device) / f"g{generation}-iter-{iteration}.pt"
    return torch.load(path, weights_only=True) if path.exists() else {}


def forget(root, device: int) -> None:
    """The device was preempted: its memory went with it."""
    shutil.rmtree(device_dir(root, device), ignore_errors=True)


@dataclass(frozen=True)
class RecoveryPlan:
    iteration: int  # the iterations done: the next generation starts there
    sources: dict  # new rank -> {item: new rank it receives it from} (layout/holdings.sources_of)

    def to_json(self) -> dict:
        return {"iteration": self.iteration,
                "sources": {str(r): {item_key(i): s for i, s in items.items()} for r, items in self.sources.items()}}

    @staticmethod
    def sources_from_json(doc: dict) -> dict[int, dict[tuple, int]]:
        return {int(r): {item_from_key(k): int(s) for k, s in items.items()} for r, items in doc["sources"].items()}


def recovery_plan(root, generation: int, old_devices, old: Layout, new_devices, new: Layout,
                  bandwidth) -> tuple[RecoveryPlan | None, str]:
    """The last iteration after which every item of layout `new` (on `new_devices`, the run's device ids in
    rank order) is held by one of its devices that was in `generation` (on `old_devices`, layout `old`) and
    still has that iteration's file, and where each rank gets what it lacks; (None, why) when there is none.
    `bandwidth`: the run's device-by-device link rates (the fastest holder is the source)."""
    had_by_device = {old_devices[r]: items for r, items in holdings(old).items()}
    has = holdings(new)
    wanted = set().union(*has.values())
    files = {d: {k for g, k in saved(root, d) if g == generation} for d in new_devices if d in had_by_device}
    rate = np.asarray(bandwidth)[np.ix_(new_devices, new_devices)]
    why = ""
    for k in sorted(set().union(*files.values()) if files else set(), reverse=True):
        had = {r: had_by_device[d] for r, d in enumerate(new_devices) if k in files.get(d, ())}
        missing = wanted - set().union(*had.values())
        if not missing:
            return RecoveryPlan(k, sources_of(had, has, rate)), ""
        why = why or f"after iteration {k} no survivor of the new layout holds {item_key(min(missing))}"
    return None, why or "no device of the new layout holds anything of the last one"


def latest_recovery_plan(root, generations: list[tuple[int, tuple, Layout]], new_devices, new: Layout,
                         bandwidth) -> tuple[RecoveryPlan | None, int | None, str]:
    """recovery_plan from the latest of `generations` ((generation, devices, layout), oldest first) whose
    copies cover the new layout: a generation stopped before its ranks kept anything leaves its devices the
    copies of the one before. Returns (plan, its generation, why not: the latest generation's reason)."""
    first_why = ""
    for g, devices, layout in reversed(generations):
        plan, why = recovery_plan(root, g, devices, layout, new_devices, new, bandwidth)
        if plan is not None:
            return plan, g, ""
        first_why = first_why or why
    return None, None, first_why
