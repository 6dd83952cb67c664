"""Every subcommand, every flag, given bad values: one line, a non-zero exit, nothing left behind, no hang.

The flags come from the parser itself (a new flag is covered the day it is added) and their bad values from
their argparse types: a flag whose type this file does not know fails the test, so every flag says what it
takes. Free-text flags get a fixed list of mistakes (the same cases every run). Each case runs
in-process against a valid, cheap invocation of its command with one flag replaced; the steps that would
train, emulate or sweep are replaced by a stub that raises `Reached`, so a value that gets that far was
accepted. `python tests/test_cli_inputs.py` prints every case that misbehaves and the counts by kind.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.cli import build_parser, main
from harness.plan import arg_types as F
from harness.cli.run_flags import rank_order_text

DATA = Path(__file__).parent / "data"
INVENTORY = DATA / "cluster-2node.yaml"
HANG_S = 60  # a case that takes longer is a hang (an unbounded search)


class Reached(BaseException):
    """Raised by the stubs of the expensive steps: the command accepted its input and went to work."""


class Hang(BaseException):
    pass


# A valid, cheap invocation of every command (positionals first; `{tmp}`: the case's directory).
BASES: dict[str, list[str]] = {
    "allocate": ["--scenario", "sky", "--devices", "4", "--layers", "8", "--batch", "4", "--allocator", "even"],
    "cluster sbatch": ["--inventory", str(INVENTORY), "--", "--system", "ours"],
    "emulate": ["--scenario", "5", "--devices", "8", "--", "true"],
    "fl": ["--scenario", "owl-testbed", "--strategy", "naive"],
    "fl report": ["{tmp}/fl.json"],
    "hetpipe plan": ["--scenario", "hetpipe-testbed", "--policy", "np"],
    "net verify": ["--scenario", "5", "--devices", "8"],
    "net plan": ["--scenario", "5", "--devices", "8"],
    "net apply": ["--inventory", str(INVENTORY), "--node", "gpu-a", "--dry-run"],
    "net clear": ["--inventory", str(INVENTORY), "--node", "gpu-a", "--dry-run"],
    "regress": ["--quick"],
    "regress history": ["--history", "{tmp}/history.jsonl"],
    "report runs": ["{tmp}/results"],
    "report case": ["{tmp}/results"],
    "report convergence": ["{tmp}/results"],
    "reproduce": ["hetpipe", "--no-emulated", "--out", "{tmp}/reproduce"],
    "run": ["--scenario", "5", "--devices", "8", "--network", "none"],
    "scenario show": ["5", "--devices", "8", "--no-plots"],
    "scenario export": ["5", "--json"],
    "schedule": ["--scenario", "5", "--devices", "8", "--budget", "20", "--quiet"],
    "schedule compare": ["--scenario", "5", "--devices", "8", "--budget", "20", "--seed", "0",
                         "--schedulers", "random"],
    "sim": ["--scenario", "5", "--devices", "8", "--budget", "20", "--no-cache", "--system", "ours"],
    "sim (cnn)": ["--scenario", "hetpipe-testbed", "--model", "vgg19", "--system", "hetpipe", "--policy", "np"],
    "sim report": ["--hetpipe-only"],
    "sim calibrate": ["{tmp}/results"],
    "sim compare": ["{tmp}/results"],
    "tune": ["--scenario", "5", "--devices", "8", "--system", "megatron", "--network", "none"],
}
NEEDS_A_CASE = {"report case"}  # reads what `make scenario-N` wrote: its base is refused, its values too
NO_FLAGS = {"net clean", "net show", "scenario list"}  # nothing to give a bad value to

# Inputs a user tried that once crashed, hung, lied or were accepted silently (issue 52), beside the generated:
# each must be refused in one line, except those in ACCEPTED, which must end well.
EXTRA: list[tuple[str, list[str]]] = [
    ("hetpipe plan", ["--scenario", "sky", "--policy", "ed"]),
    ("sim", ["--scenario", "sky", "--model", "vgg19"]),
    ("schedule", ["--scenario", "5", "--devices", "8", "--d-pp", "3"]),
    ("schedule", ["--scenario", "5", "--devices", "8", "--batch", "1000", "--micro-batch", "3"]),
    ("schedule", ["--scenario", "5", "--devices", "8", "--scheduler", "bogus"]),
    ("sim", ["--scenario", "5", "--system", "hetpipe"]),
    ("sim", ["--scenario", "5", "--devices", "8", "--tp", "2"]),
    ("sim", ["--scenario", "5", "--devices", "8", "--policy", "np"]),
    ("sim", ["--scenario", "5", "--devices", "8", "--batch", "10", "--micro-batch", "3"]),
    ("sim report", ["--hetpipe-only", "--no-hetpipe"]),
    ("sim report", ["--cases", "9"]),
    ("allocate", ["--scenario", "sky", "--layers", "100000", "--allocator", "optimal"]),
    ("allocate", ["--scenario", "sky", "--batch", "10", "--micro-batch", "3", "--allocator", "even"]),
    ("hetpipe plan", ["--scenario", "hetpipe-testbed", "--policy", "np", "--in-flight", "1000"]),
    ("hetpipe plan", ["--scenario", "hetpipe-testbed", "--policy", "0,1;1,2"]),
    ("cluster sbatch", ["--inventory", str(INVENTORY), "--", "--pp", "3", "--dp", "3", "--system", "megatron"]),
    ("cluster sbatch", ["--inventory", str(INVENTORY), "--", "--batch", "10", "--micro-batch", "3"]),
    ("cluster sbatch", ["--inventory", str(INVENTORY), "--", "--d-pp", "3", "--d-dp", "3"]),
    ("cluster sbatch", ["--inventory", str(INVENTORY), "--", "--scheduler", "bogus"]),
    ("run", ["--scenario", "5", "--devices", "8", "--network", "none", "--batch", "10", "--micro-batch", "3"]),
    ("run", ["--scenario", "5", "--devices", "8", "--network", "none", "--scheduler", "bogus"]),
    ("run", ["--scenario", "5", "--devices", "8", "--network", "none", "--d-pp", "3"]),
    ("tune", ["--scenario", "5", "--devices", "8", "--system", "megatron", "--network", "none", "--batch", "10",
              "--micro-batch", "3"]),
    ("sim compare", ["{tmp}/scenario.yaml"]),
    # the last wave's (issue 78): HetPipe and Horovod runs, checkpoints, re-plans, FL over the emulated cluster
    ("run", ["--scenario", "hetpipe-testbed", "--devices", "8", "--network", "none", "--system", "hetpipe",
             "--policy", "bogus"]),
    ("run", ["--scenario", "hetpipe-testbed", "--devices", "8", "--network", "none", "--system", "hetpipe",
             "--policy", "0,1;1,2"]),
    ("run", ["--scenario", "hetpipe-testbed", "--devices", "8", "--network", "none", "--system", "ours",
             "--staleness", "2"]),
    ("run", ["--scenario", "5", "--devices", "8", "--network", "none", "--system", "horovod", "--pp", "2"]),
    ("run", ["--scenario", "5", "--devices", "8", "--network", "none", "--replan"]),
    ("run", ["--scenario", "5", "--devices", "8", "--network", "none", "--timeline", "{tmp}/file.txt"]),
    ("run", ["--scenario", "5", "--devices", "8", "--network", "none", "--compute-time-scale", "10"]),
    ("fl", ["--scenario", "owl-testbed", "--strategy", "naive", "--compute-time-scale", "10"]),
    ("fl", ["--scenario", "owl-testbed", "--strategy", "naive", "--backend", "emu", "--kernel", "host",
            "--alpha", "7"]),
    ("report runs", ["{tmp}/results", "--sim-csv", "{tmp}/binary.bin"]),
    ("fl", ["--scenario", "owl-testbed", "--strategy", "naive", "--json", "{tmp}/file.txt/x.json"]),
    ("sim", ["--scenario", "5", "--devices", "8", "--budget", "20", "--no-cache", "--system", "ours",
             "--json", "{tmp}/file.txt/x.json"]),
]

ACCEPTED = [("schedule", ["--scenario", "5", "--devices", "8", "--budget", "1", "--json", "{tmp}/cmp/a.json"]),
            ("schedule compare", ["--scenario", "5", "--devices", "8", "--budget", "1", "--out", "{tmp}/cmp"]),
            ("sim", ["--scenario", "5", "--devices", "8", "--budget", "1", "--no-cache"]),
            ("scenario show", ["5", "--devices", "8", "--out", "{tmp}/show"]),
            ("hetpipe plan", ["--scenario", "hetpipe-testbed", "--policy", "ed", "--json", "{tmp}/show/p.json"])]

# Free text that any value of is valid (a Slurm partition, the command to emulate).
FREE = {("cluster sbatch", "--partition"), ("cluster sbatch", "--time"), ("emulate", "cmd"),
        ("cluster sbatch", "run_args")}


def _files(tmp: Path) -> dict[str, str]:
    """The bad paths: missing, a directory, a binary file, a path below a file."""
    (tmp / "dir").mkdir(exist_ok=True)
    (tmp / "binary.bin").write_bytes(bytes(range(256)) * 4)
    (tmp / "file.txt").write_text("not a directory\n")
    return {"missing": str(tmp / "missing" / "x.yaml"), "dir": str(tmp / "dir"), "binary": str(tmp / "binary.bin"),
            "file": str(tmp / "file.txt"), "under_file": str(tmp / "file.txt" / "x")}


# Free text a user might type by mistake.
TEXT = ["bogus", "", "0", " ", "é", "1e400", "../x", "a;b"]


def bad_values(action: argparse.Action, files: dict[str, str], text: list[str]) -> list[str]:
    """Values `action` must refuse, from its type."""
    t = action.type
    if action.choices is not None:
        return ["bogus"]
    if t is F.positive_int:
        return ["0", "-2", "x", "1.5"]
    if t is F.positive_float:
        return ["0", "-1.5", "nan", "inf", "x"]
    if t is F.non_negative_int:
        return ["-1", "x"]
    if t is F.non_negative_float:
        return ["-0.5", "nan", "inf", "x"]
    if t is F.input_file:
        return [files["missing"], files["dir"], files["binary"]]
    if t is F.input_dir:
        return [files["missing"], files["binary"]]
    if t is F.input_path:
        return [files["missing"], files["binary"]]
    if t is F.output_file:
        return [files["dir"], files["under_file"]]
    if t is F.output_dir:
        return [files["file"], files["under_file"]]
    if t is F.fractions:
        return ["0", "1.5", "x", "nan"]
    if t is F.scenario_name:
        return [*text, files["missing"], files["binary"], files["dir"]]
    if t is None or t is F.nonempty:
        return text
    if getattr(t, "__qualname__", "").startswith("number_in."):  # arg_types.number_in(...): just outside
        low, high, low_open, high_open = t.bounds
        return [repr(low) if low_open else repr(low - 0.5), repr(high) if high_open else repr(high + 0.5),
                "nan", "x"]
    if getattr(t, "__qualname__", "").startswith("one_of."):  # arg_types.one_of(...)
        return ["bogus", ""]
    if t is rank_order_text:
        return ["bogus", "-1", "", "1.5"]
    if t is F.name_list:
        return ["", "a,,b", "bogus", " "]
    if t is F.byte_sizes:
        return ["", "0", "4X", "1.5M", "64K,", "-1", "x"]
    if t is F.codec_text:
        return ["bogus", "", "cocktail:topk_ratio=2", "cocktail:x=1", "int8:quant_bits=4", "cocktail:quant_bits=3",
                "cocktail:quant_bucket_size=x"]
    if t is F.seconds_list:
        return ["", "-1", "x", "nan", "inf", "0,,1"]
    raise AssertionError(f"{action.option_strings or action.dest}: type {t!r} has no bad values here: give the "
                         "flag one of harness/plan/arg_types.py's types")


def _subparsers(parser):
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            yield from a.choices.items()


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every leaf command: 'sim', 'sim report', ... -> its parser."""
    out = {}

    def walk(p, path):
        subs = list(_subparsers(p))
        if path:
            out[" ".join(path)] = p
        for name, sp in subs:
            walk(sp, [*path, name])
    walk(build_parser(), [])
    return {k: v for k, v in out.items() if k not in ("cluster", "hetpipe", "net", "report", "scenario")}


@dataclass
class Case:
    command: str
    argv: list[str]
    label: str


def _with(base: list[str], action: argparse.Action, value: str) -> list[str]:
    """`base` with `action` given `value` (its own occurrence in `base` dropped)."""
    if not action.option_strings:  # a positional: replace the first one
        head, sep, tail = (base, [], []) if "--" not in base else (base[:base.index("--")], ["--"],
                                                                      base[base.index("--") + 1:])
        if action.dest in ("run_args", "cmd"):
            return [*head, "--", value]
        i = next((k for k, t in enumerate(head) if not t.startswith("-") and (k == 0 or not head[k - 1]
                                                                             .startswith("--"))), None)
        return [*head[:i], value, *head[i + 1:], *sep, *tail] if i is not None else [value, *base]
    flag = action.option_strings[0]
    out, k = [], 0
    cut = base.index("--") if "--" in base else len(base)
    head, tail = base[:cut], base[cut:]
    while k < len(head):
        if head[k] in action.option_strings:
            k += 1
            while k < len(head) and not head[k].startswith("--"):
                k += 1
            continue
        out.append(head[k])
        k += 1
    return [*out, f"{flag}={value}" if value.startswith("-") else flag, *([] if value.startswith("-") else [value]),
            *tail]


def cases(tmp: Path) -> list[Case]:
    files, text = _files(tmp), TEXT
    out = []
    for name, parser in commands().items():
        if name in NO_FLAGS:
            continue
        assert name in BASES, f"harness {name}: no base invocation in tests/test_cli_inputs.py"
        bases = [(n, b) for n, b in BASES.items() if n.split(" (")[0] == name]
        for bname, base in bases:
            for action in parser._actions:
                if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                    continue
                if action.nargs == 0 or action.help == argparse.SUPPRESS or (name, action.option_strings[0]
                                                                              if action.option_strings
                                                                              else action.dest) in FREE:
                    continue
                for v in bad_values(action, files, text):
                    label = f"{action.option_strings[0] if action.option_strings else action.dest}={v!r}"
                    out.append(Case(name, [*bname.split(" (")[0].split(), *_with(base, action, v)], label))
    for name, argv in EXTRA:
        out.append(Case(name, [*name.split(), *argv], "extra"))
    return out


def _fill(argv: list[str], tmp: Path) -> list[str]:
    return [a.replace("{tmp}", str(tmp)) for a in argv]


def prepare(tmp: Path) -> None:
    """The inputs the bases read: FL records, a results tree with one run, a history file, a YAML file."""
    from harness.results import IterationRecord, manifest, write_records

    _files(tmp)
    rc = _call(["fl", "--scenario", "owl-testbed", "--strategy", "naive", "--json", str(tmp / "fl.json"),
                "--out", str(tmp / "flrun")], tmp)[0]
    assert rc == 0
    rec = IterationRecord(run_id="r1", scenario="5-worldwide", system="ours", backend="emu", kernel="uml",
                          devices=8, d_pp=4, d_dp=2, model="tiny", layers=4, hidden=64, seq=32, batch=8,
                          micro_batch=1, seed=0, bandwidth_scale=1.0, iteration=1, seconds=1.0, pflop=1e-9,
                          pflops=1e-9, tokens_per_s=256.0, compute_seconds=0.5, exposed_comm_seconds=0.1, loss=2.0,
                          d_tp=1, config="{}", compute_overruns=0)
    run = tmp / "results" / "emu" / "r1"
    write_records(run / "records.csv", [rec])
    (run / "manifest.json").write_text(json.dumps(manifest("r1", "ok", data={"set": "markov", "loss_floor": 1.5})))
    (tmp / "history.jsonl").write_text("")
    (tmp / "scenario.yaml").write_text((Path(__file__).parents[1] / "scenarios" / "sky.yaml").read_text())


def _call(argv: list[str], tmp: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()

    def on_alarm(signum, frame):
        raise Hang()

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(HANG_S)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 2
            except Reached:
                rc = 0
    except Hang:
        rc = "hang"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return rc, out.getvalue(), err.getvalue()


def _lines(stderr: str) -> list[str]:
    """What a user reads: progress bars (carriage returns) and deprecation notes left out."""
    lines = [ln.rsplit("\r", 1)[-1].strip() for ln in stderr.split("\n")]
    return [ln for ln in lines if ln and not ln.startswith("harness: note:")]


def _snapshot(tmp: Path) -> set[Path]:
    return {p for p in tmp.rglob("*") if p.is_file()}


def verdict(case: Case, tmp: Path) -> tuple[str, str]:
    """('ok', '') or (kind, detail) with kind: hang, traceback, accepted, long, left-ok."""
    before = _snapshot(tmp)
    rc, out, err = _call(_fill(case.argv, tmp), tmp)
    new = _snapshot(tmp) - before
    said_ok = [p for p in new if p.name == "manifest.json" and '"ok"' in p.read_text()]
    for p in new:
        p.unlink()
    lines = _lines(err)
    if rc == "hang":
        return "hang", f"over {HANG_S} s"
    if "Traceback" in err or "internal error" in err:
        return "traceback", (lines or [""])[-1][:200]
    if said_ok:
        return "left-ok", f"{said_ok[0].relative_to(tmp)} (rc {rc})"
    if rc == 0:
        return "accepted", (out.strip().splitlines() or [""])[0][:120]
    if len(lines) > 2:
        return "long", f"{len(lines)} lines: {lines[0][:120]}"
    if new:
        return "left-files", ", ".join(str(p.relative_to(tmp)) for p in sorted(new))[:200]
    return "ok", ""


@pytest.fixture
def stubs(monkeypatch, tmp_path):
    install_stubs(monkeypatch, tmp_path)
    return tmp_path


def install_stubs(monkeypatch, tmp_path: Path) -> None:
    """The expensive steps raise Reached; results, work and schedules stay in tmp_path."""
    import harness.network.emulate
    import harness.network.registry
    import harness.network.verify
    import harness.regress
    import harness.report.sim
    import harness.results
    import harness.systems.baselines.tune
    import harness.train.cluster
    import harness.train.experiment
    from harness.plan.layouts import plan_run

    def reach(*a, **k):
        raise Reached()

    def plan_then_reach(req, *a, **k):
        plan_run(req)
        raise Reached()

    def plan_all_then_reach(reqs, *a, **k):
        for r in reqs:
            plan_run(r)
        raise Reached()

    monkeypatch.setattr(harness.train.experiment, "execute", plan_then_reach)
    monkeypatch.setattr(harness.train.experiment, "execute_many", plan_all_then_reach)
    monkeypatch.setattr(harness.train.cluster, "run_under_torchrun", plan_then_reach)
    monkeypatch.setattr(harness.systems.baselines.tune, "tune", plan_then_reach)
    monkeypatch.setattr(harness.network.emulate, "run_emulated", reach)
    monkeypatch.setattr(harness.network.verify, "verify", reach)
    monkeypatch.setattr(harness.network.registry, "clean", reach)
    monkeypatch.setattr(harness.regress, "exact_figures", reach)
    monkeypatch.setattr(harness.report.sim, "sweep_cases", reach)
    monkeypatch.setattr(harness.report.sim, "sweep_sections", reach)
    monkeypatch.setattr(harness.results, "RESULTS_DIR", tmp_path / "default-results")
    monkeypatch.chdir(tmp_path)
    prepare(tmp_path)


GROUPS = sorted({name.split(" (")[0] for name in BASES})


@pytest.mark.parametrize("command", GROUPS)
def test_every_flag_refuses_bad_values_in_one_line(stubs, command):
    """No traceback, no hang, a non-zero exit with at most two lines, nothing written that says ok."""
    bad = []
    for case in cases(stubs):
        if case.command == command:
            kind, detail = verdict(case, stubs)
            if kind != "ok":
                bad.append(f"{kind}: harness {' '.join(_fill(case.argv, stubs))} ({case.label}): {detail}")
    assert not bad, f"{len(bad)} inputs misbehave:\n" + "\n".join(bad)


def test_the_bases_are_valid(stubs):
    """Every base invocation is accepted: otherwise a refused bad value would prove nothing."""
    for name, base in BASES.items():
        if name in NEEDS_A_CASE:
            continue
        argv = _fill([*name.split(" (")[0].split(), *base], stubs)
        rc, out, err = _call(argv, stubs)
        assert rc == 0, f"harness {' '.join(argv)}: {err.strip()}"


@pytest.mark.parametrize("command,argv", ACCEPTED, ids=[" ".join(a[:4]) for _, a in ACCEPTED])
def test_inputs_that_once_crashed_now_work(stubs, command, argv):
    """A budget of one candidate, a scenario's heatmaps: exit 0, files written readable by others (umask 022)."""
    import os

    old = os.umask(0o022)
    try:
        rc, out, err = _call(_fill([*command.split(), *argv], stubs), stubs)
    finally:
        os.umask(old)
    assert rc == 0 and "Traceback" not in err, err
    written = [p for p in stubs.rglob("*") if p.is_file() and p.stat().st_mtime >= stubs.stat().st_mtime - 1
               and ("cmp" in p.parts or "show" in p.parts or "default-results" in p.parts)]
    assert written, out
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in written), [(p, oct(p.stat().st_mode)) for p in written]


def test_a_closed_pipe_ends_quietly():
    """`harness scenario export 5 --json | head -c 1`: no BrokenPipeError, no traceback."""
    import subprocess

    p = subprocess.Popen([sys.executable, "-m", "harness", "scenario", "export", "5", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.close()  # the reader leaves before the JSON is written (or while it is)
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) in (0, 141) and err == "", err


def test_version():
    rc, out, err = _call(["--version"], Path("."))
    assert rc == 0 and out.startswith("harness ") and err == ""


def test_every_command_has_a_base():
    assert set(commands()) - NO_FLAGS <= {n.split(" (")[0] for n in BASES}


if __name__ == "__main__":  # the count of misbehaving inputs by kind (issue 52's note)
    import collections
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as d, pytest.MonkeyPatch.context() as mp:
        tmp = Path(d)
        install_stubs(mp, tmp)
        counts = collections.Counter()
        only = sys.argv[1:]
        for case in cases(tmp):
            if only and case.command not in only:
                continue
            t0 = time.monotonic()
            kind, detail = verdict(case, tmp)
            if time.monotonic() - t0 > 3:
                print(f"slow ({time.monotonic() - t0:.0f} s): harness {' '.join(_fill(case.argv, tmp))}", flush=True)
            counts[kind] += 1
            if kind != "ok":
                print(f"{kind}: harness {' '.join(_fill(case.argv, tmp))} ({case.label}): {detail}", flush=True)
        print(dict(counts), "of", sum(counts.values()), file=sys.stderr)
