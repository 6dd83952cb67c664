"""`harness sim compare`: measured runs against the simulator: the mean iteration of each run configuration, and
iteration by iteration for runs under a timeline; FL runs against the flow simulation."""
from __future__ import annotations

from pathlib import Path

from ..errors import HarnessError


def profile_overrides(args):
    if not getattr(args, "profile", None):
        return None
    from ..compute.profiles import load_profiles

    return load_profiles(args.profile)


def cmd_compare(args) -> int:
    from ..files import atomic_write_text
    from ..sim.compare import compare, format_table, load_measured

    if _holds_fl_records(Path(args.records)):
        return _compare_fl(args)
    notes: list[str] = []
    records = read_input(args.records, lambda path: load_measured(path, notes))
    rows = compare(records, profile_overrides(args), args.dtype)
    print(format_table(rows))
    for line in notes:
        print(f"note: {line}")
    if args.csv:
        import csv
        import io

        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["scenario", "system", "backend", "devices", "model", "layers", "batch", "iterations",
                    "measured_s", "simulated_s", "error", "host_load", "cpu_busy", "host_bound_iterations",
                    "measured", "config"])
        for c in rows:
            w.writerow([c.scenario, c.system, c.backend, c.devices, c.model, c.layers, c.batch, c.iterations,
                        f"{c.measured_s:.6g}", f"{c.simulated_s:.6g}", f"{c.error:.4f}", f"{c.host_load:.3g}",
                        f"{c.cpu_busy:.3g}", c.host_bound, c.measured_what, c.config])
        atomic_write_text(args.csv, buf.getvalue())
        print(f"wrote {args.csv}")
    _timeline_runs(args, records)
    return 0


def _timeline_runs(args, records: list[dict]) -> None:
    """Runs under a timeline, iteration by iteration; with --csv also <csv>-iterations.csv and .png."""
    import pandas as pd

    from ..files import atomic_path
    from ..report.timeline import format_iterations, iterations_figure
    from ..sim.compare import compare_iterations

    rows = compare_iterations(records, profile_overrides(args))
    if not rows:
        return
    print("\nruns under a timeline, iteration by iteration:")
    print(format_iterations(rows))
    if args.csv:
        stem = Path(args.csv).with_suffix("")
        with atomic_path(Path(f"{stem}-iterations.csv")) as tmp:
            pd.DataFrame(rows).to_csv(tmp, index=False)
        print(f"wrote {stem}-iterations.csv")
        print(f"wrote {iterations_figure(rows, Path(f'{stem}-iterations.png'))}")


def _holds_fl_records(path: Path) -> bool:
    """FL runs write records.json (harness fl); training runs records.csv."""
    if path.is_dir():
        return not any(path.rglob("records.csv")) and any(path.rglob("records.json"))
    return path.suffix == ".json"


def _compare_fl(args) -> int:
    import csv
    import io

    from ..files import atomic_write_text
    from ..systems.owl.compare import compare_fl, format_table
    from ..workloads.fl.records import read

    if args.profile or args.dtype:
        raise HarnessError(f"--{'profile' if args.profile else 'dtype'}: not for FL records (their compute is the "
                           "run's modelled time)")
    rows = compare_fl(read([args.records]))
    print(format_table(rows))
    if args.csv:
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["scenario", "alpha", "strategy", "workers", "measured_s", "simulated_s", "error",
                    "distribution_s", "simulated_distribution_s", "server_bytes", "planned_server_bytes",
                    "rack_bytes", "planned_rack_bytes", "cpu_busy", "host_bound", "measured"])
        for c in rows:
            r, s = c.record, c.simulated
            w.writerow([r.scenario, r.alpha, r.strategy, r.workers, f"{r.seconds:.6g}", f"{s.seconds:.6g}",
                        f"{c.error:.4f}", f"{r.distribution_seconds:.6g}", f"{s.distribution_seconds:.6g}",
                        f"{r.server_bytes:.0f}", f"{s.server_bytes:.0f}", f"{sum(r.rack_bytes):.0f}",
                        f"{c.planned_rack_bytes:.0f}", "" if r.cpu_busy is None else f"{r.cpu_busy:.3g}",
                        r.host_bound, c.measured_what])
        atomic_write_text(args.csv, buf.getvalue())
        print(f"wrote {args.csv}")
    return 0


def read_input(path: Path, reader):
    from ..errors import HarnessError

    if not Path(path).exists():
        raise HarnessError(f"{path}: file not found")
    try:
        return reader(path)
    except (KeyError, ValueError) as e:
        raise HarnessError(f"{path}: not a records CSV of the shared schema ({e})") from None
