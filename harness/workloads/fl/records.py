"""The FL record: one simulated round of one strategy in one setting, beside the training records.

A run writes results/<scenario>/<run-id>/records.json (a list of these) and manifest.json, as the
CNN simulations do; `harness fl report` reads them back (or any `--json` file).
"""
from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path

from ...files import read_text
from .federation import Federation, FLError
from .flows import traffic
from .models import BYTES_PER_PARAM, BranchyModel
from .strategies import NORMALISE_TO, Round

WORKLOAD = "fl"


@dataclass(frozen=True)
class FLRecord:
    run_id: str
    scenario: str
    backend: str  # sim | emu (measured in the emulated cluster: harness/systems/owl/)
    workload: str  # "fl": tells these records from the training ones
    model: str
    strategy: str
    workers: int
    racks: int
    rack_shape: str  # "50x2": racks x workers per rack
    alpha: float  # B_inter / B_intra
    batch: int
    seconds: float  # one round: forward overlapping distribution, then backward, aggregation, update
    distribution_seconds: float  # until the last worker holds the whole model
    forward_seconds: float
    e0_seconds: float  # backward + gradient all-reduce + update, common to every strategy
    server_bytes: float
    config: str  # the strategy's choices, JSON (owl: {"D": ...}; ipart: {"messages": ...})
    # bytes inside each rack and across racks while distributing, and of the gradient all-reduce (all ranks):
    # the plan's (sim), or counted as sent (emu)
    rack_bytes: tuple[float, ...] = ()
    inter_rack_bytes: float = 0.0
    allreduce_bytes: float = 0.0
    bandwidth_scale: float = 1.0  # the run's scales (emu; a simulation at paper scale: 1)
    compute_time_scale: float = 1.0
    overruns: int = 0  # emu: layers whose real computation outlasted their modelled time
    server_wire_bytes: float = 0.0  # emu: what the server's interface sent in the round, as its kernel counts it
    cpu_busy: float | None = None  # emu: the emulated CPU's busy share over the round (network/headroom.py)
    host_bound: bool = False  # emu: the CPU was busy and delayed the layers: the round measured the host

    def setting(self) -> tuple:
        """What records must share to be compared (normalised to naive)."""
        return (self.scenario, self.backend, self.model, self.rack_shape, self.alpha, self.batch, self.bandwidth_scale,
                self.compute_time_scale)


FL_FIELDS = [f.name for f in fields(FLRecord)]
REQUIRED = [f.name for f in fields(FLRecord) if f.default is MISSING]


def to_record(r: Round, *, run_id: str, fed: Federation, model: BranchyModel, batch: int) -> FLRecord:
    _, racks, inter = traffic(fed, r.transfers)
    ring = 2 * (fed.workers - 1) * model.params * BYTES_PER_PARAM  # every rank's 2 (W-1)/W of the model
    return FLRecord(run_id, fed.name, "sim", WORKLOAD, model.name, r.strategy, fed.workers, len(fed.racks), fed.shape,
                    round(fed.alpha, 6), batch, r.seconds, r.distribution_seconds, r.forward_seconds, r.e0_seconds,
                    r.server_bytes, json.dumps(r.config, sort_keys=True), racks, inter, float(ring))


def as_json(records: list[FLRecord]) -> list[dict]:
    return [asdict(r) for r in records]


def read(paths: list[Path]) -> list[FLRecord]:
    """FL records of JSON files, or of every records.json below directories; other records are skipped."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted(p.rglob("records.json"))
        elif p.exists():
            files.append(p)
        else:
            raise FLError(f"{p}: file not found")
    out = []
    for f in files:
        try:
            doc = json.loads(read_text(f, "JSON records file"))
        except json.JSONDecodeError as e:
            raise FLError(f"{f}: not a JSON records file ({e})") from None
        if not isinstance(doc, list):
            raise FLError(f"{f}: not a JSON list of records")
        for k, d in enumerate(doc):
            if not isinstance(d, dict) or d.get("workload") != WORKLOAD:
                continue
            missing = [n for n in REQUIRED if n not in d]
            if missing:
                raise FLError(f"{f}: record {k}: missing {missing[0]!r}")
            rec = FLRecord(**{n: d[n] for n in FL_FIELDS if n in d})
            out.append(replace(rec, rack_bytes=tuple(rec.rack_bytes)))
    if not out:
        raise FLError(f"no FL records in {', '.join(map(str, paths))} (write some with `harness fl ... --json`)")
    return out


def normalised(records: list[FLRecord]) -> dict[int, float]:
    """seconds / naive's seconds in the same setting, by index into `records` (where naive ran)."""
    naive = {r.setting(): r.seconds for r in records if r.strategy == NORMALISE_TO}
    return {k: r.seconds / naive[r.setting()] for k, r in enumerate(records) if r.setting() in naive}
