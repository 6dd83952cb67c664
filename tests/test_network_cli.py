"""CLI and kernel choice of the network layer, without booting anything."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from harness.cli import main
from harness.network import kernel, registry
from harness.network.emulate import EmulationError, run_emulated
from harness.scenario import load_scenario

NET4 = "tests/data/net-4dev.yaml"
pytestmark = pytest.mark.machine  # the network registry, namespaces, the emulated cluster


@pytest.mark.parametrize("argv, needle", [
    (["emulate", "--scenario", "7", "--", "true"], "unknown scenario"),
    (["emulate", "--scenario", "5", "--devices", "1000", "--", "true"], "--devices: 1000"),
    (["net", "verify", "--scenario", "nope"], "unknown scenario"),
    (["net", "verify", "--scenario", "5", "--devices", "12"], "--devices: 12"),
    (["emulate", "--scenario", NET4], "no command given"),
])
def test_bad_inputs_are_one_line_errors(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("value", ["0", "-1", "abc"])
def test_bandwidth_scale_must_be_positive(value, capsys):
    assert main(["emulate", "--scenario", NET4, "--bandwidth-scale", value, "--", "true"]) == 2
    assert "--bandwidth-scale: must be a number > 0" in capsys.readouterr().err


def test_library_rejects_bad_arguments_before_booting():
    topo = load_scenario(NET4)
    with pytest.raises(EmulationError, match="mode"):
        run_emulated(topo, ["true"], mode="nope")
    with pytest.raises(EmulationError, match="command"):
        run_emulated(topo, [])
    with pytest.raises(kernel.KernelError, match="--kernel"):
        run_emulated(topo, ["true"], kernel="qemu")


def test_dry_run_prints_namespaces_and_shaping(capsys):
    assert main(["net", "plan", "--scenario", NET4, "--bandwidth-scale", "0.01"]) == 0
    out = capsys.readouterr().out
    assert out.count("ip netns add harness-") == 4
    assert out.count(" htb rate ") == 12 and out.count(" netem delay ") == 12
    assert "rate 20000000bit ceil 20000000bit" in out  # 2 Gbps x 0.01, device 0 -> 1
    assert main(["emulate", "--scenario", NET4, "--dry-run"]) == 0
    assert "netem delay 15000us" in capsys.readouterr().out


def test_kernel_choice_is_explicit():
    missing = kernel.host_missing()
    if missing:
        with pytest.raises(kernel.KernelError, match="--kernel host: .*lacks"):
            kernel.choose("host")
    else:
        assert kernel.choose("host") == "host" == kernel.choose("auto")
    if not kernel.uml_missing() and missing:
        assert kernel.choose("auto") == "uml"


def test_show_and_clean_run_without_leftovers(capsys):
    assert main(["net", "show"]) == 0
    assert "run(s)" in capsys.readouterr().out
    assert main(["net", "clean"]) == 0
    assert "net clean:" in capsys.readouterr().out


def test_kill_uml_waits_for_every_process_of_the_kernel_after_its_main_one_is_gone():
    """UML runs as several host processes; when the main one is already gone (a killed launcher), the
    others, still exiting or not, are found by their umid= argument and are gone when kill_uml returns."""
    rid = registry.new_run_id()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])  # a main process that has exited
    gone.wait()
    helpers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", f"umid={registry.umid(rid)}"])
               for _ in range(2)]
    try:
        deadline = time.monotonic() + 30
        while len(registry._uml_pids(rid)) < 2 and time.monotonic() < deadline:  # cmdline readable
            time.sleep(0.01)
        assert sorted(registry._uml_pids(rid)) == sorted(p.pid for p in helpers)
        registry.kill_uml(gone.pid, rid)
        assert registry._uml_pids(rid) == []
        assert [p.wait(timeout=10) for p in helpers] == [-signal.SIGKILL] * 2
    finally:
        for p in helpers:
            if p.poll() is None:
                p.kill()
                p.wait()
