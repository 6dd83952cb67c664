"""`harness reproduce PAPER`: a paper's evaluation regenerated, each figure beside the paper's, a verdict per claim.

One module per paper (hetpipe.py, ...) declares its `Paper`: the parts of its evaluation (each a function
that simulates or runs what a figure or table shows and returns its claims with the harness's figures),
the settings the paper does not state with the values assumed, and a guess of each part's time here.
`reproduce` runs the parts in order into one directory and writes report.md (report.py) last, so a
stopped run leaves no report that claims more than was run. The registry names each module by
"module:attribute", imported on first use, as the system registry does.
"""
from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..errors import HarnessError
from .claims import Section


@dataclass(frozen=True)
class Context:
    """What a part runs with: where its plots go, whether to shorten the measured parts, where to say progress."""

    out: Path
    quick: bool = False
    progress: Callable[[str], None] = lambda _msg: None
    found: dict = field(default_factory=dict)  # what a part leaves for the parts after it (its runs' directories)


@dataclass(frozen=True)
class Part:
    """One step of a reproduction: `run(ctx)` returns the sections (figures, tables) it reproduced."""

    name: str
    summary: str
    seconds: float  # expected here (a 2-core machine), for the estimate printed before a run
    run: Callable[[Context], list[Section]]
    quick_seconds: float | None = None  # when QUICK shortens it
    measured: bool = False  # trains for real (emulated cluster or loopback): left out by --no-emulated
    in_quick: bool = True  # QUICK runs it (False: too long for a first look; QUICK names it as left out)


@dataclass(frozen=True)
class Setting:
    """A setting the paper does not state, the value the harness assumed, and why that value."""

    name: str
    value: str
    why: str


@dataclass(frozen=True)
class Paper:
    name: str
    title: str
    seed: str  # the seed file's number under ../shared/seeds/, or where to read a paper that is not a seed
    summary: str
    parts: tuple[Part, ...]
    settings: tuple[Setting, ...] = field(default_factory=tuple)

    def runs(self, quick: bool, emulated: bool = True) -> list[Part]:
        """The parts a reproduction runs: without `emulated` none that trains, under `quick` only its own."""
        return [p for p in self.parts if (emulated or not p.measured) and (p.in_quick or not quick)]

    def expected_seconds(self, quick: bool, emulated: bool = True) -> float:
        return sum((p.quick_seconds if quick and p.quick_seconds is not None else p.seconds)
                   for p in self.runs(quick, emulated))


#: every paper `harness reproduce` knows: name -> "module:attribute" of its Paper
PAPERS = {"hetpipe": "harness.reproduce.hetpipe:PAPER", "owl": "harness.reproduce.owl:PAPER",
          "sky": "harness.reproduce.sky:PAPER", "dtfm": "harness.reproduce.dtfm:PAPER",
          "cocktail": "harness.reproduce.cocktail:PAPER"}


def get(name: str) -> Paper:
    if name not in PAPERS:
        raise HarnessError(f"reproduce: unknown paper {name!r} (known: {', '.join(sorted(PAPERS))})")
    module, attr = PAPERS[name].split(":")
    return getattr(importlib.import_module(module), attr)


@dataclass
class Reproduction:
    paper: Paper
    quick: bool
    sections: list[Section]
    seconds: float  # wall time of the parts
    left_out: list[tuple[Part, str]] = field(default_factory=list)  # parts not run, and why (--no-emulated, QUICK)


def reproduce(name: str, out: Path, quick: bool = False, progress: Callable[[str], None] | None = None,
              emulated: bool = True) -> Path:
    """Run every part of paper `name` into `out` (without `emulated`, only those that run no training through
    the emulated cluster); returns report.md's path (written last)."""
    from .report import write_report

    paper = get(name)
    say = progress or (lambda _msg: None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(out, quick, say)
    sections: list[Section] = []
    parts = paper.runs(quick, emulated)
    t0 = time.monotonic()
    for k, part in enumerate(parts, 1):
        say(f"[{k}/{len(parts)}] {part.summary}")
        sections += part.run(ctx)
    left_out = [(p, "`--no-emulated`" if p.measured and not emulated else "QUICK") for p in paper.parts
                if p not in parts]
    return write_report(Reproduction(paper, quick, sections, time.monotonic() - t0, left_out), out)


def reproduce_all(root: Path, quick: bool = False, progress: Callable[[str], None] | None = None,
                  emulated: bool = True) -> tuple[Path, list[str]]:
    """Every paper of PAPERS in turn, each into root/<paper>/ (QUICK: root/<paper>/quick/), then root/index.md
    (QUICK: index-quick.md) linking their reports with their verdict counts. A paper that fails is named in the
    index and the others go on; returns (the index's path, the papers that failed)."""
    from .report import write_index

    say = progress or (lambda _msg: None)
    root = Path(root)
    done: dict[str, Path | str] = {}
    for k, name in enumerate(PAPERS, 1):
        say(f"paper {k}/{len(PAPERS)}: {name}")
        try:
            done[name] = reproduce(name, root / name / ("quick" if quick else ""), quick, say, emulated)
        except Exception as e:  # noqa: BLE001 -- one paper's failure (a user error or a bug) does not stop the others
            say(f"{name}: failed: {e}")
            done[name] = str(e) if isinstance(e, HarnessError) else f"{type(e).__name__}: {e}"
    index = write_index(root, {get(n).title: r for n, r in done.items()}, quick)
    return index, [n for n, r in done.items() if not isinstance(r, Path)]
