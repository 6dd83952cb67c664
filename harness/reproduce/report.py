"""A reproduction's report.md and claims.csv: per figure the paper's claims, the harness's figures beside
them and a verdict each; the tally first, the settings the paper does not state last."""
from __future__ import annotations

import csv
import io
import platform
import time
from pathlib import Path

from ..files import atomic_write_text
from ..regress import machine
from ..results import git_commit
from .claims import TOLERANCE, VERDICTS, Section, fmt, paper_cell, tally


def write_report(rep, out: Path) -> Path:
    """claims.csv, then report.md (last: its presence says the run finished)."""
    atomic_write_text(out / "claims.csv", claims_csv(rep.sections))
    path = out / "report.md"
    atomic_write_text(path, render(rep))
    return path


def write_index(root: Path, reports: dict, quick: bool) -> Path:
    """root/index.md (QUICK: index-quick.md): each paper's report linked, with its verdict counts read back from
    its claims.csv (simulated and measured), or the line that stopped it (`reports`: paper's title -> report.md's
    path, or the error)."""
    L = [f"# Reproductions{' (QUICK)' if quick else ''}", "",
         f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `harness reproduce all"
         f"{' --quick' if quick else ''}` at commit `{git_commit()}`. Verdicts per claim (simulated at the paper's "
         "scale / measured here); every report says what each claim is and why one may differ.", "",
         "| paper | report | " + " | ".join(VERDICTS) + " | measured: " + " | ".join(VERDICTS[:3]) + " |",
         "|" + "---|" * (2 + len(VERDICTS) + 3)]
    for title, rep in reports.items():
        if not isinstance(rep, Path):
            L.append(f"| {title} | failed: {rep} |" + " |" * (len(VERDICTS) + 3))
            continue
        rows = list(csv.DictReader((rep.parent / "claims.csv").open()))
        sim = [sum(r["verdict"] == v for r in rows) for v in VERDICTS]
        meas = [sum(r["measured_verdict"] == v for r in rows) for v in VERDICTS[:3]]
        L.append(f"| {title} | [{rep.relative_to(root)}]({rep.relative_to(root)}) | " + " | ".join(map(str, sim))
                 + " | " + " | ".join(map(str, meas)) + " |")
    path = Path(root) / ("index-quick.md" if quick else "index.md")  # a first look does not replace the full run's
    atomic_write_text(path, "\n".join(L) + "\n")
    return path


def claims_csv(sections: list[Section]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["figure", "claim", "where", "paper", "simulated", "verdict", "measured", "measured_verdict", "note",
                "why"])
    for s in sections:
        for f in s.findings:
            c = f.claim
            w.writerow([c.figure, c.text, c.where, paper_cell(c), "" if f.simulated is None else f"{f.simulated:.6g}",
                        f.verdict, "" if f.measured is None else f"{f.measured:.6g}", f.measured_verdict, f.note,
                        c.why])
    return buf.getvalue()


def render(rep) -> str:
    p = rep.paper
    m = machine()
    counts = tally(rep.sections)
    L = [f"# Reproducing {p.title}", "", p.summary, "",
         f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `harness reproduce {p.name}"
         f"{' --quick' if rep.quick else ''}` at commit `{git_commit()}` in {rep.seconds:.0f} s; machine: {m['cpu']} "
         f"({m['cpus']} CPUs), {m['system']} {platform.release()}. The paper: "
         + (f"`../shared/seeds/{p.seed}_*`." if p.seed.isdigit() else f"{p.seed}."), "",
         f"A claim **holds** when the harness's figure is within {TOLERANCE:.0%} of the paper's; its **direction "
         "holds** when the figure is off but on the side the paper's is (a speedup above 1, one system above "
         "another); otherwise it **differs**, with what the harness can name as the reason. *Simulated* figures "
         "are the simulator's at the paper's scale; the paper's numbers are references only, never inputs.", "",
         "| verdict | claims |", "|---|---|"]
    L += [f"| {v} | {counts[v]} |" for v in VERDICTS if counts[v]]
    L.append("")
    for why in dict.fromkeys(w for _, w in rep.left_out):
        L += [f"Not run ({why}): " + "; ".join(p.summary for p, w in rep.left_out if w == why) + ".", ""]
    for s in rep.sections:
        L += _section(s)
    if p.settings:
        L += ["## Settings the paper does not state", "", "| setting | value assumed | why |", "|---|---|---|"]
        L += [f"| {x.name} | {x.value} | {x.why} |" for x in p.settings]
        L.append("")
    return "\n".join(L)


def _section(s: Section) -> list[str]:
    measured = any(f.measured is not None for f in s.findings)
    L = [f"## {s.title}", ""]
    if s.text:
        L += [s.text, ""]
    head = ["claim", "paper (where)", "simulated", "verdict"] + (["measured", "verdict"] if measured else []) + \
        ["why it may differ"]
    L += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for f in s.findings:
        c = f.claim
        sim = fmt(f.simulated, c.unit) + (f" ({f.note})" if f.note else "")
        row = [c.text, f"{paper_cell(c)} ({c.where})", sim, _mark(f.verdict)]
        if measured:
            row += [fmt(f.measured, c.unit), _mark(f.measured_verdict)]
        short = {"direction holds", "differs"}  # the verdicts a reason explains
        row.append(c.why if f.verdict in short or (measured and f.measured_verdict in short) else "")
        L.append("| " + " | ".join(row) + " |")
    L.append("")
    L += [f"![{name}]({name})" for name in s.plots]
    return L + ([""] if s.plots else [])


def _mark(v: str) -> str:
    return f"**{v}**" if v == "holds" else v
