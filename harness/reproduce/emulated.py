"""What every reproduction's measured parts share: runs in one boot of the emulated cluster, and each run's measured
seconds beside the simulator's prediction of it (sim compare: the same compute model, nothing fitted on the run)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..plan.asked import request_of
from ..plan.request import RunRequest
from . import Context


def emulate(ctx: Context, what: str, asked: dict[str, dict | RunRequest]) -> dict[str, Path]:
    """Run `asked` (label -> run request, as asked or built) in one boot of the cluster; label -> run directory. A
    run that does not finish stops the reproduction with one line naming it."""
    from ..errors import HarnessError
    from ..train.experiment import execute_many

    reqs = [a if isinstance(a, RunRequest) else request_of(a) for a in asked.values()]
    iters = sorted({r.run.iters for r in reqs})
    ctx.progress(f"emulated: {what}: {', '.join(asked)}, {'/'.join(map(str, iters))} timed iteration(s) each, "
                 "in one boot")
    results = execute_many(reqs)
    for label, r in zip(asked, results):
        if not isinstance(r, Path):
            raise HarnessError(f"reproduce: emulated run {label} ({what}) did not finish: {r or 'not started'}")
    return dict(zip(asked, results))


def seconds(runs: dict[str, dict]) -> tuple[dict, dict]:
    """Each run's measured seconds an iteration, and the simulator's (`runs`: label -> regress.run_figures)."""
    return ({k: r["seconds"] for k, r in runs.items()},
            {k: r["seconds"] / r["measured-over-sim"] for k, r in runs.items()})


def runs_table(runs: dict[str, dict]) -> str:
    """Markdown: every run's measured and simulated seconds, their gap, the emulated CPU's busy share and the
    iterations the host bound (`runs`: label -> run_figures and "busy")."""
    measured, predicted = seconds(runs)
    return ("| run | measured s | simulated s | measured vs simulated | emulated CPU busy | host-bound iterations |\n"
            "|---|---|---|---|---|---|\n" +
            "\n".join(f"| {k} | {measured[k]:.3f} | {predicted[k]:.3f} | {r['measured-over-sim'] - 1:+.1%} | "
                      f"{r['busy']:.0%} | {r['host-bound']:.0f} |" for k, r in runs.items()))


def busy(run: Path) -> float:
    """The emulated CPU's busy share during the run (its headroom as measured; nan when not measured)."""
    head = json.loads((run / "manifest.json").read_text()).get("headroom") or {}
    return float(head.get("busy", np.nan)) if head.get("measured") else float("nan")
