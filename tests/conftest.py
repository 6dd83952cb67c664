"""Shared test helpers: a Topology from explicit matrices, and a CLI runner in-process."""
from __future__ import annotations

import numpy as np
import pytest

from harness.scenario import DeviceProfile, Link, Region, Topology
from harness.scenario.transport import PRESETS


def make_topology(delay_ms, bandwidth_gbps, name="test", transport=PRESETS["tuned"]) -> Topology:
    """A one-device-per-region Topology from (N, N) matrices (diagonal ignored). Its TCP settings are tuned
    (windows that cover every link) unless a test asks for others: closed forms at the rate from byte one."""
    delay = np.array(delay_ms, dtype=float)
    bw = np.array(bandwidth_gbps, dtype=float)
    n = len(delay)
    np.fill_diagonal(delay, 0.0)
    np.fill_diagonal(bw, np.inf)
    prof = DeviceProfile("test", 1.0, 1.0)
    regions = tuple(Region(f"r{i}", 1, Link(0.0, 1.0), prof) for i in range(n))
    return Topology(name, "", "<test>", regions, tuple(range(n)), delay, bw, transport=transport)


def random_topology(n: int, seed: int, name="random") -> Topology:
    """Heterogeneous, asymmetric delays 1-200 ms and bandwidths 0.1-10 Gbps."""
    rng = np.random.default_rng(seed)
    return make_topology(rng.uniform(1, 200, (n, n)), rng.uniform(0.1, 10, (n, n)), name)


def assert_same_json(got, want, where: str = "") -> None:
    """`got` equals the JSON document `want`: keys, lengths and values exactly, floats to 1e-12 relative
    (snapshots are one machine's arithmetic). The failure names the path of the first difference."""
    if isinstance(want, float) and isinstance(got, (int, float)):
        assert got == pytest.approx(want, rel=1e-12, abs=0.0), where
    elif isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            assert_same_json(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: length"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same_json(g, w, f"{where}[{i}]")
    else:
        assert got == want, where


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's loadgroup reads the groups
def pytest_collection_modifyitems(config, items):
    """`make test` runs on two pytest-xdist workers; tests of machine-wide state (the network registry under /run,
    namespaces, the user-mode Linux kernel with half the machine's memory, make targets that boot it) go to one of
    them together, one at a time, as they would run alone. The Slurm tests are a group of their own, beside them:
    their daemons live in a namespace of their own (ports included), boot no kernel, and mostly wait on Slurm;
    what they register is told apart by the emulated tests' leftover checks (tests/emulation.py)."""
    for item in items:
        if item.get_closest_marker("slurm"):
            item.add_marker(pytest.mark.xdist_group("slurm"))
        elif item.get_closest_marker("net") or item.get_closest_marker("machine"):
            item.add_marker(pytest.mark.xdist_group("machine"))


def pytest_collection_finish(session):
    """On an xdist worker under --dist loadgroup: fail at once if the machine-wide tests were not grouped
    (xdist once stopped grouping silently, under pytest 9), rather than run emulations side by side."""
    if getattr(session.config.option, "loadgroup", False):
        loose = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
        if loose:
            raise pytest.UsageError(f"pytest-xdist did not group {len(loose)} machine-wide tests, e.g. {loose[0]}")


@pytest.fixture
def cli(capsys):
    """Run `harness ARGS...` in-process; returns (exit code, stdout, stderr)."""
    from harness.cli import main

    def run(*args):
        try:
            rc = main([str(a) for a in args])
        except SystemExit as e:  # argparse usage errors
            rc = e.code
        out = capsys.readouterr()
        return rc, out.out, out.err

    return run


#: The groups of the summary at the end of a run: which marker puts a test in which.
GROUPS = (("slurm", "Slurm"), ("net", "emulated"), ("machine", "emulated"))


def _group(report) -> str:
    return next((name for marker, name in GROUPS if marker in report.keywords), "unit")


def pytest_terminal_summary(terminalreporter):
    """After pytest's slowest 15: the seconds of each file and a one-line total per group (unit tests on both
    workers; emulated and Slurm one at a time on one), so the next slow test is seen where it lands."""
    files: dict[str, float] = {}
    groups: dict[str, list[float]] = {}
    for reports in terminalreporter.stats.values():
        for r in reports:
            if getattr(r, "when", None) not in ("setup", "call", "teardown") or not hasattr(r, "duration"):
                continue
            path = r.nodeid.split("::")[0]
            files[path] = files.get(path, 0.0) + r.duration
            g = groups.setdefault(_group(r), [0.0, 0])
            g[0] += r.duration
            g[1] += r.when == "call" or (r.when == "setup" and r.outcome == "skipped")
    if not files:
        return
    tr = terminalreporter
    tr.write_sep("=", "seconds per file")
    for path, s in sorted(files.items(), key=lambda kv: -kv[1]):
        tr.write_line(f"{s:8.1f} s  {path}")
    tr.write_sep("=", "seconds per group")
    for name in ("unit", "emulated", "Slurm"):
        if name in groups:
            s, n = groups[name]
            tr.write_line(f"{name}: {n} tests, {s:.0f} s")
