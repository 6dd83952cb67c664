"""Measured runs side by side: one row per (system, layout), mean over runs and iterations, with the
simulator's prediction beside it when `sim compare --csv` output is given; runs.csv, pflops.png, iterations.png."""
from __future__ import annotations

import json
import platform
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import HarnessError
from ..files import atomic_write_text
from ..results import read_records
from .. import plots
from ..plots.figures import save_figure

ROW = ["system", "layout", "backend", "kernel"]  # one row of the runs table, one bar of pflops.png
SIM_CSV = "sim-vs-emu.csv"  # where `make scenario-5` puts `sim compare --csv`: beside the runs directory


def load_runs(root: Path) -> pd.DataFrame:
    """Records of every ok run below `root` (a run without manifest counts as ok), with its layout and label."""
    root = Path(root)
    if not root.exists():
        raise HarnessError(f"{root}: no such directory")
    rows = []
    for rec_file in sorted(root.rglob("records.csv")):
        manifest = rec_file.parent / "manifest.json"
        status = json.loads(manifest.read_text()).get("status") if manifest.exists() else "ok"
        if status != "ok":
            continue
        rows += read_records(rec_file)
    if not rows:
        raise HarnessError(f"{root}: no records.csv of a successful run below it")
    df = pd.DataFrame(rows)
    df["config"] = df["config"].fillna("").astype(str)
    # a run whose devices left and came back (train/elastic.py) ran on several layouts: it stays one row, under
    # the layout it was planned with; devices.png shows what it ran on when
    df["changed_devices"] = df.groupby("run_id").devices.transform("nunique") > 1
    df["config"] = df.groupby("run_id").config.transform("first")
    df["layout"] = df.apply(_layout, axis=1)
    df["label"] = df.apply(_label, axis=1)
    df["placement_seed"] = df.apply(lambda r: _seed(_config(r) or {}), axis=1)
    return df


def unfinished_runs(root: Path) -> list[tuple[Path, str, str]]:
    """Runs below `root` left out of the table: (run directory, state, reason). State: the manifest's
    (`failed`, `running`), or `killed` for one still `running` whose harness process on this host is gone
    (`harness net clean` fails such a manifest)."""
    from ..network.registry import pid_alive

    out = []
    for manifest in sorted(Path(root).rglob("manifest.json")):
        try:
            m = json.loads(manifest.read_text())
        except (OSError, ValueError):
            out.append((manifest.parent, "unreadable", "manifest.json is not JSON"))
            continue
        state = m.get("status")
        if state == "ok":
            continue
        if state == "running" and m.get("host") == platform.node() and m.get("pid") and not pid_alive(m["pid"]):
            state = "killed"
        out.append((manifest.parent, str(state), str(m.get("reason") or "")))
    return out


def runs_table(root: Path | pd.DataFrame, sim_csv: Path | None = None) -> pd.DataFrame:
    """One row per system and layout: seconds and PFLOPS (mean, min and max over the runs' means), what they
    measured (the emulated CPU's busy share and the host-bound iterations: `measured` is network, host or
    unknown) and, given a `sim compare` CSV, the simulated PFLOPS of the row's runs (mean, min, max; nan when
    unmatched)."""
    df = root if isinstance(root, pd.DataFrame) else load_runs(root)
    df = df.assign(cpu_busy=pd.to_numeric(df.get("cpu_busy", np.nan), errors="coerce"),
                   host_bound=df.get("host_bound", False).fillna(False).astype(bool))
    per_run = df.groupby(ROW + ["run_id"], as_index=False).agg(
        seconds=("seconds", "mean"), pflops=("pflops", "mean"), label=("label", "first"),
        placement_seed=("placement_seed", "first"), cpu_busy=("cpu_busy", "mean"), host_bound=("host_bound", "sum"))
    table = per_run.groupby(ROW, as_index=False).agg(
        runs=("run_id", "count"), seconds=("seconds", "mean"), seconds_min=("seconds", "min"),
        seconds_max=("seconds", "max"), pflops=("pflops", "mean"), pflops_min=("pflops", "min"),
        pflops_max=("pflops", "max"), label=("label", "first"), cpu_busy=("cpu_busy", "mean"),
        host_bound=("host_bound", "sum"),
        seeds=("placement_seed", lambda s: ", ".join(sorted({x for x in s if x}, key=lambda x: (len(x), x)))))
    seeded = table.seeds != ""
    table.loc[seeded, "label"] = table.label[seeded] + " (seeds " + table.seeds[seeded] + ")"
    dup = table.label.duplicated(keep=False)  # short labels that collide get the full layout
    t = table[dup]
    table.loc[dup, "label"] = t.label + " " + t.layout + " " + t.backend + "/" + t.kernel
    table["measured"] = np.where(table.host_bound > 0, "host", np.where(table.cpu_busy.notna(), "network", "unknown"))
    table.loc[table.host_bound > 0, "label"] = table.label[table.host_bound > 0] + " [host-bound]"  # on the figures
    if sim_csv is not None:
        table = table.merge(_simulated(df, read_sim_csv(sim_csv)), on=ROW, how="left")
    return table.sort_values("seconds").reset_index(drop=True)


def read_sim_csv(path: Path) -> pd.DataFrame:
    path = Path(path)
    try:
        sim = pd.read_csv(path, dtype={"config": str}, keep_default_na=False, na_values={"simulated_s": ["", "nan"]})
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise HarnessError(f"{path}: cannot read the sim compare CSV ({e})") from None
    missing = {"system", "simulated_s"} - set(sim.columns)
    if missing:
        raise HarnessError(f"{path}: not a `sim compare --csv` file (no {', '.join(sorted(missing))} column)")
    return sim


def _simulated(df: pd.DataFrame, sim: pd.DataFrame) -> pd.DataFrame:
    """Simulated PFLOPS per table row: the run's PFLOP per iteration / simulated seconds, the sim rows
    matched by (system, backend, config). A CSV without a config column is matched by system and backend
    only, and only where that names a single row (megatron with and without a rank order cannot be told apart)."""
    keys = [k for k in ("system", "backend", "config") if k in sim.columns]
    per = df.groupby(ROW + [k for k in keys if k not in ROW], as_index=False).agg(pflop=("pflop", "mean"))
    per = per[~per.duplicated(keys, keep=False)]
    m = per.merge(sim[keys + ["simulated_s"]], on=keys)
    m["sim_pflops"] = m.pflop / m.simulated_s
    return m.groupby(ROW, as_index=False).agg(sim_pflops=("sim_pflops", "mean"), sim_pflops_min=("sim_pflops", "min"),
                                              sim_pflops_max=("sim_pflops", "max"))


def _config(r) -> dict | None:
    try:
        c = json.loads(r.get("config") or "")
    except (json.JSONDecodeError, TypeError):
        return None
    return c if isinstance(c, dict) else None


def _placement(c: dict) -> str:
    """Seeded placements of one kind share a row (the paper's mean over random layouts)."""
    p = str(c.get("placement", ""))
    if p.startswith("seed-") or c.get("rank_order"):  # (records before harness/layout/: rank_order)
        return "seeded"
    return p


def _seed(c: dict) -> str:
    """The seed of a seeded placement ("2022"), else ""."""
    p = str(c.get("placement", ""))
    if p.startswith("seed-"):
        return p[len("seed-"):]
    seed = c.get("rank_order")  # (records before harness/layout/: a seed, or the permutation itself)
    return str(seed) if isinstance(seed, int) and not isinstance(seed, bool) else ""


def _layout(r) -> str:
    """The row key of a run's layout: degrees, schedule, sync and kind of placement; device lists are
    left out, so seeds of one kind stay together and a permuted run stays apart from rank order."""
    c = _config(r)
    if c is None:
        return str(r.get("config") or f"tp={r['d_tp']},pp={r['d_pp']},dp={r['d_dp']}")
    keep = {k: v for k, v in c.items() if not isinstance(v, (list, dict)) and k != "placement"}
    placement = _placement(c)
    return ",".join([f"{k}={v}" for k, v in keep.items()] + ([f"placement={placement}"] if placement else []))


def _label(r) -> str:
    """A tick label a reader can hold: "megatron tp1 pp4 dp2 seeded", "ours pp4 dp2 ga"."""
    c = _config(r) or {"tp": r["d_tp"], "pp": r["d_pp"], "dp": r["d_dp"]}
    parts = [f"zero{c['zero']}"] if c.get("zero") else []
    parts += [f"{short}{c[k]}" for k, short in (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("d_pp", "pp"), ("d_dp", "dp"))
              if k in c and not (k == "tp" and c.get("zero"))]
    placement = _placement(c)
    return " ".join([r["system"], *parts] + ([placement] if placement not in ("", "rank-order") else []))


def pflops_figure(table: pd.DataFrame):
    """Bars: measured FLOP rate (mean of the runs, whiskers min-max); beside them the simulated one, if
    any; in the unit where the bars read 1-1000 (tiny emulated runs are GFLOPS, paper scale PFLOPS)."""
    import matplotlib.pyplot as plt

    series = {"measured (mean of runs)": table.pflops.to_numpy()}
    errors = {"measured (mean of runs)": np.vstack([table.pflops - table.pflops_min, table.pflops_max - table.pflops])}
    if "sim_pflops" in table and table.sim_pflops.notna().any():
        series["simulated (sim compare)"] = table.sim_pflops.to_numpy()
        errors["simulated (sim compare)"] = np.nan_to_num(np.vstack(
            [table.sim_pflops - table.sim_pflops_min, table.sim_pflops_max - table.sim_pflops]))
    unit, factor = plots.flop_rate_unit(np.concatenate([table.pflops_max, *series.values()]))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.0 * len(table) + 2), 4.5))
    plots.grouped_bars(ax, list(table.label), {k: v * factor for k, v in series.items()}, unit,
                       f"{unit} per system and layout (whiskers: min-max over runs)",
                       errors={k: v * factor for k, v in errors.items()})
    return fig


def iterations_figure(df: pd.DataFrame):
    """Seconds of every timed iteration (warm-up excluded, as recorded), one line per run."""
    import matplotlib.pyplot as plt

    its = sorted(df.iteration.unique())
    series = {}
    for (label, seed, run_id), g in df.groupby(["label", "placement_seed", "run_id"]):
        series[f"{label}{f' {seed}' if seed else ''} ({run_id})"] = g.groupby("iteration").seconds.mean().reindex(its).to_numpy()
    fig, ax = plt.subplots(figsize=(min(12.0, max(6.0, 0.25 * len(its) + 3)), 4.5))
    plots.lines(ax, [str(i) for i in its], series, "seconds", "iteration time per run")
    ax.set_xlabel("iteration", fontsize=8)
    step = max(1, len(its) // 20)  # keep the tick labels apart on long runs
    for i, t in enumerate(ax.get_xticklabels()):
        t.set_visible(i % step == 0)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def devices_figure(df: pd.DataFrame):
    """Runs whose devices changed: each iteration's seconds and the devices it ran on, over the run's time (the
    end of each iteration from the start of the first timed one); None when no run's devices changed."""
    import matplotlib.pyplot as plt

    moved = df[df.changed_devices]
    if moved.empty:
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.0, 5.5), sharex=True)
    for (label, run_id), g in moved.groupby(["label", "run_id"]):
        g = g.sort_values("iteration")
        t = g.seconds.cumsum().to_numpy()
        color, marker = plots.series_style(label)
        line, = top.step(t, g.seconds, where="pre", color=color, label=f"{label} ({run_id})")  # over its own time
        color = line.get_color()
        top.plot(t, g.seconds, marker, color=color, markersize=3)
        bottom.step(np.concatenate([[0.0], t]), np.concatenate([[g.devices.iloc[0]], g.devices]), where="pre",
                    color=color)
    top.set_ylabel("iteration seconds", fontsize=8)
    top.set_title("runs whose devices left and came back", fontsize=9)
    bottom.set_ylabel("devices", fontsize=8)
    bottom.yaxis.get_major_locator().set_params(integer=True)
    bottom.set_xlabel("seconds since the first timed iteration began", fontsize=8)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend(fontsize=7)
    return fig


def default_sim_csv(root: Path) -> Path | None:
    p = Path(root).resolve().parent / SIM_CSV
    return p if p.exists() else None


def write_runs_table(root: Path, out_dir: Path | None = None, sim_csv: Path | None = None) -> tuple[str, list[Path]]:
    """runs.csv, pflops.png and iterations.png in `out_dir` (default `root`), and devices.png when some run's
    devices changed; each file is written whole."""
    import matplotlib.pyplot as plt

    df = load_runs(root)
    table = runs_table(df, sim_csv)
    out_dir = Path(out_dir or root)
    text = table.drop(columns="label").to_string(index=False, float_format=lambda x: f"{x:.4g}")
    if (table.host_bound > 0).any():
        text += ("\nmeasured host: the emulated CPU was busy for most of host_bound iterations of these rows, so their "
                 "figures are the host's, not the links' (each run's manifest: headroom.advice says what to change)")
    figs = {"pflops.png": pflops_figure(table), "iterations.png": iterations_figure(df)}
    if (moved := devices_figure(df)) is not None:
        figs["devices.png"] = moved
    csv = out_dir / "runs.csv"
    atomic_write_text(csv, table.to_csv(index=False))
    paths = [csv]
    try:
        for name, fig in figs.items():
            paths.append(save_figure(fig, out_dir / name))
    finally:
        for fig in figs.values():
            plt.close(fig)
    return text, paths


def run_summary(run: Path) -> str:
    """The paragraph `harness run` ends with: what ran, seconds per iteration, FLOP rate, where the records are."""
    recs = read_records(Path(run) / "records.csv")
    if not recs:
        return f"{run}: no timed iterations recorded"
    r0, secs = recs[0], [r["seconds"] for r in recs]
    mean = sum(secs) / len(secs)
    rate = r0["pflop"] / mean
    unit, factor = plots.flop_rate_unit([rate])
    doc = _manifest(Path(run))
    data = doc.get("data")
    floor = f" (floor {data['loss_floor']:.4g} on {data['set']} data)" if data else ""
    return (f"{r0['system']} on {r0['scenario']} ({r0['devices']} devices, {r0['backend']}, kernel {r0['kernel']}), "
            f"{r0['model']} L={r0['layers']} batch {r0['batch']}: {len(secs)} timed iterations, {mean:.4g} s per "
            f"iteration (min {min(secs):.4g}, max {max(secs):.4g}), {rate * factor:.4g} {unit}, "
            f"{r0['batch'] * r0['seq'] / mean:.4g} tokens/s, loss {recs[-1]['loss']:.4g}{floor}; records: "
            f"{Path(run) / 'records.csv'}, manifest: {Path(run) / 'manifest.json'}{_replans(doc)}"
            f"{_restarts(doc, len(secs), sum(secs))}{_headroom(doc)}")


def _headroom(doc: dict) -> str:
    """An emulated run's CPU headroom: how busy the cluster's CPU was, and, when it bounded iterations, the
    line that says the run measured the host and which flag to change."""
    h = doc.get("headroom")
    if not isinstance(h, dict) or not h.get("measured"):
        return ""
    line = (f"; emulated CPU {h['busy']:.0%} busy (host steal {h['steal']:.0%}): "
            f"{'HOST-BOUND' if h['host_bound'] else 'not host-bound'}, {h['host_bound_iterations']}/{h['iterations']} "
            f"iterations host-bound")
    return line + (f"\n{h['advice']}" if h.get("advice") else "")


def _restarts(doc: dict, iterations: int, seconds: float) -> str:
    """Devices that left and came back: the elastic agent's restarts, what they cost, useful iterations per hour."""
    if "elastic" not in doc:
        return ""
    rs = [e for e in doc["elastic"]["events"] if e["event"] == "restart"]
    lost = sum(e["lost_iterations"] + e["in_flight"] for e in rs)
    return (f"; devices left and came back: {len(rs)} restarts ({sum(e['after'] == 'preempt' for e in rs)} after a "
            f"preemption), {lost} iterations lost, {iterations / seconds * 3600:.4g} useful iterations per hour "
            f"(recoveries.csv)")


def _replans(doc: dict) -> str:
    """--replan: each new plan, from which iteration (1-based, warm-up included, as the progress lines), and
    its cost."""
    if "replans" not in doc:
        return ""
    taken = [r for r in doc["replans"] if r["taken"]]
    parts = [f"iteration {r['iteration'] + 1} (search {r['search_s']:.3g} s, moves {r.get('move_s', 0):.3g} s, "
             f"{r.get('moved_bytes', 0) / 1e6:.3g} MB)" for r in taken]
    return (f"; re-plans: {len(doc['replans'])} searched, {len(taken)} taken" +
            (f": from {', '.join(parts)}" if parts else ""))


def _manifest(run: Path) -> dict:
    """The run's manifest ({} when unreadable)."""
    try:
        return json.loads((run / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
