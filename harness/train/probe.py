"""The probe before a dilated run: each request once, undilated, in its own boot of the emulated cluster.

A command whose runs use the compute model and set no scale (compute.dilate) is probed first: one warm-up and one
timed iteration of each request at dilation 1, into a scratch results root of the command's work directory. Its
timed iteration's seconds and the emulated CPU's busy share then (network/headroom.py) are the host's cost of an
iteration; plan/dilation.py chooses the factor from them and the models, and the requests run at it. The links of a
boot are shaped once, so the probe is a boot of its own (tens of seconds, said on stderr).
"""
from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from ..errors import HarnessError
from ..plan.dilation import Dilation, Probe, choose, dilated, modelled_seconds
from ..plan.layouts import plan_run
from ..plan.request import RunRequest
from ..results import read_records


def wanted(reqs: list[RunRequest]) -> bool:
    """Whether the command's runs are to be dilated: every one asks for it (they share the links' scale)."""
    return bool(reqs) and all(r.compute.dilate for r in reqs)


def undilated(reqs: list[RunRequest]) -> list[RunRequest]:
    return [replace(r, compute=replace(r.compute, dilate=False)) for r in reqs]


def probe_and_dilate(reqs: list[RunRequest], work: Path, record_many) -> tuple[list[RunRequest], Dilation | None]:
    """The requests at the dilation their probe calls for, and that dilation (None: not asked for, or a timeline's
    times, which do not dilate yet). `record_many(plans, work)`: runs plans in one boot (emulated.record_in_one_boot
    with experiment.record_run), returning each run's directory or error."""
    if not wanted(reqs):
        return undilated(reqs), None
    scratch = Path(work) / "probe"
    probe_reqs = [replace(r, compute=replace(r.compute, dilate=False),
                          run=replace(r.run, iters=1, warmup=1, run_id=None, results_root=str(scratch),
                                      checkpoint_every=None, resume=None)) for r in reqs]
    plans = [plan_run(r) for r in probe_reqs]  # the requests' layouts and topology: what the models are asked of
    if any(p.topo.timeline is not None for p in plans):
        _say("time dilation: off (the run's timeline gives its changes in seconds, which do not dilate yet); "
             "set --compute-time-scale and --bandwidth-scale by hand")
        return undilated(reqs), None
    _say(f"time dilation: probing this host's cost of an iteration ({len(reqs)} run(s), undilated, one boot)")
    got = record_many(plans, work)
    probes = []
    for req, res in zip(reqs, got):
        label = req.run.system
        if not isinstance(res, Path):
            raise HarnessError(f"time dilation: the probe of {label} did not finish ({res or 'stopped'}); give "
                               f"--compute-time-scale to run without one")
        probes.append(_probe(label, res))
    d = choose([(p.spec, p.topo) for p in plans], probes)
    _say(d.line())
    # each run's timeout from its own length: a run's iterations may differ from the probe's (DiLoCo's syncs)
    whole = [modelled_seconds(replace(p.spec, run=replace(p.spec.run, warmup=r.run.warmup, iters=r.run.iters)),
                              p.topo, d.factor, pr.kernel) for r, p, pr in zip(reqs, plans, probes)]
    return [dilated(r, d, t) for r, t in zip(reqs, whole)], d


def _probe(label: str, run: Path) -> Probe:
    doc = json.loads((run / "manifest.json").read_text())
    head = doc.get("headroom") or {}
    recs = read_records(run / "records.csv")
    if not head.get("measured") or not recs:
        raise HarnessError(f"time dilation: the probe of {label} measured no CPU headroom ({run}); give "
                           f"--compute-time-scale to run without one")
    return Probe(label, sum(r["seconds"] for r in recs) / len(recs), float(head["busy"]), str(recs[0]["kernel"]))


def _say(line: str) -> None:
    print(f"harness: {line}", file=sys.stderr, flush=True)
