"""A paper's claim beside what the harness finds, and the verdict: the vocabulary of every reproduction.

A claim is what a paper states about one figure or table: a number (a throughput, a ratio of two systems)
or a direction (one system above another). The harness puts its own figure beside it, simulated at the
paper's scale or measured at the testbed's, and says whether the claim *holds* (a number within
TOLERANCE of the paper's), whether only its *direction holds* (the number is off, the side of the
threshold the paper's number is on is not), or whether it *differs*; a claim that is not held carries the
reason the harness can name (a setting the paper does not state, a mechanism the model leaves out).
The paper's numbers are references here, never inputs: nothing is computed from them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

TOLERANCE = 0.15  # "holds": within 15 % of the paper's number
EPS = 1e-9  # a value this close (relatively) to a direction's threshold is on it, not past it
VERDICTS = ("holds", "direction holds", "differs", "not run")


@dataclass(frozen=True)
class Claim:
    """One statement of the paper, checkable by a number.

    paper: the paper's number (None: the claim is a direction only, e.g. "Horovod above NP");
    above / below: the direction, a threshold the value must exceed / stay under (a speedup: above=1.0);
    both None with a paper number: the number alone (e.g. a throughput).
    where: where the paper says it (figure, table, section, page).
    why: what the harness leaves out or assumes that could move its figure from the paper's; printed
    beside any verdict short of "holds".
    """

    figure: str
    text: str
    where: str
    paper: float | None = None
    above: float | None = None
    below: float | None = None
    unit: str = ""
    why: str = ""

    def __post_init__(self):
        if self.paper is None and self.above is None and self.below is None:
            raise ValueError(f"claim {self.text!r}: needs the paper's number or a direction")


def verdict(claim: Claim, value: float | None, tolerance: float = TOLERANCE) -> str:
    """The verdict on `claim` given the harness's `value` (None or nan: the check did not run)."""
    if value is None or math.isnan(value):
        return "not run"
    has_direction = claim.above is not None or claim.below is not None
    in_direction = ((claim.above is None or value > claim.above + EPS * abs(claim.above)) and
                    (claim.below is None or value < claim.below - EPS * abs(claim.below)))
    if claim.paper is None:
        return "holds" if in_direction else "differs"
    if claim.paper != 0 and abs(value / claim.paper - 1) <= tolerance:
        return "holds"
    if has_direction and in_direction:
        return "direction holds"
    return "differs"


@dataclass
class Finding:
    """A claim with the harness's figures: simulated at the paper's scale and, where it runs here, measured at
    the testbed's (trained for real through the emulated cluster, or on loopback: the section says which)."""

    claim: Claim
    simulated: float | None = None
    measured: float | None = None
    note: str = ""  # what the figure is, when the claim's text does not say (e.g. the N_m it ran at)

    @property
    def verdict(self) -> str:
        """Of the paper-scale figure (the measured one has its own column)."""
        return verdict(self.claim, self.simulated)

    @property
    def measured_verdict(self) -> str:
        return verdict(self.claim, self.measured)


@dataclass
class Section:
    """One figure or table of the paper: its findings and the plots the harness drew for it."""

    title: str
    findings: list[Finding] = field(default_factory=list)
    text: str = ""  # a sentence on how it was reproduced
    plots: list[str] = field(default_factory=list)  # file names beside report.md

    def add(self, claim: Claim, simulated: float | None = None, measured: float | None = None, note: str = "") -> None:
        self.findings.append(Finding(claim, simulated, measured, note))


def smallest_step(values) -> float:
    """A series' smallest ratio of a value to the one before it: above 1 when every step raises it (Table 4's
    "performance increases when additional GPUs are used")."""
    return min(b / a for a, b in zip(values, values[1:]))


def fmt(value: float | None, unit: str = "") -> str:
    """A figure for a table: three significant digits (more where three would round it onto a whole number it is
    not: 1.003x beside a threshold of 1x), the unit after; '-' when there is none."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    digits = 3
    while abs(value) < 1000 and digits < 6 and float(text) != value and float(text).is_integer():
        digits += 1
        text = f"{value:.{digits}g}"
    return f"{text}{unit}" if unit in ("x", "%") else (f"{text} {unit}" if unit else text)


def paper_cell(claim: Claim) -> str:
    """The paper's side of a row: its number, or the direction it states."""
    if claim.paper is not None:
        return fmt(claim.paper, claim.unit)
    if claim.above is not None and claim.below is not None:
        return f"between {fmt(claim.above, claim.unit)} and {fmt(claim.below, claim.unit)}"
    return f"> {fmt(claim.above, claim.unit)}" if claim.above is not None else f"< {fmt(claim.below, claim.unit)}"


def tally(sections: list[Section]) -> dict[str, int]:
    """How many findings got each verdict (paper-scale)."""
    out = {v: 0 for v in VERDICTS}
    for s in sections:
        for f in s.findings:
            out[f.verdict] += 1
    return out
