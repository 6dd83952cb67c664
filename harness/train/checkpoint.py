"""Checkpoints of a training run, by parameter name, so that a run can go on from one on another layout.

Every `checkpoint_every` iterations each rank writes what it holds, by full GPT parameter name: its value and
its SGD momentum (fp32), to <run dir>/checkpoints/iter-<k>/rank-<r>.pt (k: the iterations done), atomically.
A checkpoint is complete once every rank of its run has written (each file says how many ranks there are).
A run resumed from it (`harness run --resume RUN_DIR`) starts at iteration k: each rank takes the names its
stage holds from whichever file has them (replicas hold the same values), on whatever layout it now has, and
every iteration after draws the same data as before (the data of an iteration is a function of its number).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

from ..errors import HarnessError

DIRNAME = "checkpoints"


def iteration_dir(root: Path, iteration: int) -> Path:
    return Path(root) / f"iter-{iteration}"


def save(root: Path, iteration: int, rank: int, world: int, held: dict) -> Path:
    """Rank `rank` of `world`: its items after `iteration` iterations (name -> (value, momentum))."""
    where = iteration_dir(root, iteration)
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"rank-{rank}.pt"
    tmp = where / f".rank-{rank}.pt.tmp"
    torch.save({"iteration": iteration, "rank": rank, "world": world,
                "held": {n: (v.detach().float().cpu(), m.detach().float().cpu()) for n, (v, m) in held.items()}}, tmp)
    os.replace(tmp, path)
    return path


def _complete(where: Path) -> bool:
    files = sorted(where.glob("rank-*.pt"))
    if not files:
        return False
    world = torch.load(files[0], weights_only=True)["world"]
    return len(files) == world


def checkpoint_root(run_dir: Path) -> Path:
    """A run directory's checkpoints/, or the directory given when it is one."""
    root = Path(run_dir)
    return root / DIRNAME if (root / DIRNAME).is_dir() else root


def _saved(root: Path) -> list[int]:
    """The iterations of every checkpoint directory under `root` (complete or not), latest first."""
    return sorted((int(p.name.split("-", 1)[1]) for p in root.glob("iter-*") if p.name.split("-", 1)[1].isdigit()),
                  reverse=True)


def latest(run_dir: Path) -> int | None:
    """The iterations done at the last complete checkpoint under `run_dir` (a run directory, or its
    checkpoints/ directory); None when there is none."""
    root = checkpoint_root(run_dir)
    return next((k for k in _saved(root) if _complete(iteration_dir(root, k))), None)


def drop_after(root: Path, iteration: int) -> None:
    """Remove the checkpoints after `iteration` under `root` (a stopped run's, perhaps incomplete: a run that
    goes on from `iteration` writes them again)."""
    for k in _saved(Path(root)):
        if k > iteration:
            shutil.rmtree(iteration_dir(root, k))


def load(run_dir: Path, iteration: int, names) -> dict:
    """name -> (value, momentum) of `names`, from the checkpoint after `iteration` iterations."""
    where = iteration_dir(checkpoint_root(run_dir), iteration)
    want, out = set(names), {}
    for path in sorted(where.glob("rank-*.pt")):
        held = torch.load(path, weights_only=True)["held"]
        out.update({n: held[n] for n in want - set(out) if n in held})
        if len(out) == len(want):
            return out
    missing = sorted(want - set(out))
    raise HarnessError(f"{where}: no rank holds {missing[0]} (and {len(missing) - 1} more): not this model's checkpoint")
