"""The registry of training systems: name -> the function every rank of that system runs.

A system is `train(ctx: RankContext, spec: RunSpec) -> list[IterationStats]`, registered
with `@register_system("name")`. It runs with the default process group initialised
(gloo on CPU, NCCL on GPU) and returns one IterationStats per timed iteration.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable

from ..errors import HarnessError

SystemFn = Callable[..., list]
SYSTEMS: dict[str, SystemFn] = {}


def register_system(name: str):
    """Decorator: `@register_system("megatron") def train(ctx, spec): ...`."""

    def deco(fn: SystemFn) -> SystemFn:
        SYSTEMS[name] = fn
        return fn

    return deco


def get_system(name: str) -> SystemFn:
    """The registered train function; imports ours, then the baseline modules, until it is found
    (lazily: a run of ours never pays for importing the baselines' torch.distributed modules)."""
    errors = []
    mods = ["harness.train.pipeline"] + [
        f"harness.train.baselines.{m.name}"
        for m in pkgutil.iter_modules(importlib.import_module("harness.train.baselines").__path__)
    ]
    for mod in mods:
        if name in SYSTEMS:
            break
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - reported only if the asked-for system is missing
            errors.append(f"{mod}: {type(e).__name__}: {e}")
    if name not in SYSTEMS:
        hint = f"; import errors: {' | '.join(errors)}" if errors else ""
        raise HarnessError(f"--system: unknown system {name!r} (known: {', '.join(sorted(SYSTEMS))}){hint}")
    return SYSTEMS[name]
