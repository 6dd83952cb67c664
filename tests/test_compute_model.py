"""The compute model: a rank's phases take what its device profile gives, overruns are counted, and the
simulator predicts a compute-model run from the device table."""
import json
import textwrap
import time

import numpy as np
import pytest

from harness import compute
from harness.model import get_model, stage_params
from harness.profiles import ComputeProfile, device_profiles
from harness.results import read_records
from harness.scenario import load_scenario
from harness.train.compute_model import ComputePacer
from harness.train.config import ComputeSection, ConfigError

SLOW = 4.0
# two fast and two slow devices (Sky Computing's penalty factor on region B)
SCENARIO = f"""\
name: half-slow
device: {{gpu: V100}}
regions:
  - {{name: A, devices: 2}}
  - {{name: B, devices: 2, device: {{slowdown: {SLOW:g}}}}}
intra_region: {{delay_ms: 1, bandwidth_gbps: 10}}
inter_region: {{delay_ms: 2, bandwidth_gbps: 5}}
"""


def test_a_phase_takes_at_least_its_modelled_time_and_a_longer_one_is_an_overrun():
    pacer = ComputePacer({"forward": 0.05, "backward": 0.001})
    t = time.perf_counter()
    with pacer.phase("forward"):
        pass  # no real work: the pacer waits the modelled 50 ms
    assert time.perf_counter() - t >= 0.05
    with pacer.phase("backward"):
        time.sleep(0.02)  # real work 20x the modelled time
    assert pacer.take() == 1 and pacer.take() == 0 and pacer.total_overruns == 1 and pacer.phases == 2


def test_rank_phases_come_from_the_one_stage_formula_and_scale_with_slowdown():
    cfg = get_model("tiny")
    fast = ComputeProfile("V100", 15.7, {"transformer": 0.3, "lm_head": 0.3})
    slow = ComputeProfile("V100", 15.7, {"transformer": 0.3, "lm_head": 0.3}, slowdown=SLOW)
    split = [2, 2, 2, 2]
    f = compute.rank_phase_seconds(cfg, split, 3, 1, fast, recompute=False)
    s = compute.rank_phase_seconds(cfg, split, 3, 1, slow, recompute=False)
    fwd, bwd = compute.stage_compute(cfg, split, 1, [fast], np.zeros(4, dtype=int), recompute=False)
    assert (f["forward"], f["backward"]) == (pytest.approx(fwd[3]), pytest.approx(bwd[3]))
    assert all(s[k] == pytest.approx(SLOW * f[k]) for k in f)
    # SGD with momentum: 4 FLOP per parameter of the stage (2 blocks and the head on the last)
    assert f["optimizer"] == pytest.approx(4 * stage_params(cfg, split)[3] / (15.7e12 * 0.3))
    # with the memory's bandwidth it is memory-bound: 20 bytes per parameter at 900 GB/s
    bw = ComputeProfile("V100", 15.7, {"transformer": 0.3, "lm_head": 0.3}, memory_bandwidth_gbs=900)
    opt = compute.rank_phase_seconds(cfg, split, 3, 1, bw, recompute=False)["optimizer"]
    assert opt == pytest.approx(20 * stage_params(cfg, split)[3] / 900e9) and opt > f["optimizer"]


def test_the_section_checks_its_values_and_travels_as_json():
    with pytest.raises(ConfigError, match="needs --compute-model"):
        ComputeSection(time_scale=10)
    with pytest.raises(ConfigError, match="compute.time_scale"):
        ComputeSection(model=True, time_scale=0)
    prof = device_profiles(load_scenario("5", devices=8), dtype="fp32")
    sec = ComputeSection(model=True, time_scale=100, devices=tuple(prof))
    from dataclasses import asdict
    again = ComputeSection(**json.loads(json.dumps(asdict(sec))))
    assert again == sec and again.devices[0].peak_tflops == 15.7


def test_scale_without_the_model_is_one_line(cli):
    rc, out, err = cli("run", "--scenario", "5", "--devices", "8", "--network", "none", "--compute-time-scale", "5")
    assert rc == 2 and err.count("\n") == 1 and "--compute-model" in err


def _run(cli, tmp_path, *extra):
    scen = tmp_path / "half-slow.yaml"
    scen.write_text(textwrap.dedent(SCENARIO))
    rc, out, err = cli("run", "--scenario", scen, "--network", "none", "--d-pp", 4, "--d-dp", 1, "--batch", 4,
                       "--iters", 2, "--out", tmp_path / "res", "--scheduler", "identity", *extra)
    assert rc == 0, err
    run = next((tmp_path / "res" / "half-slow").iterdir())
    man = json.loads((run / "manifest.json").read_text())
    return man, read_records(run)


def test_ranks_on_slow_devices_take_their_modelled_time(cli, tmp_path):
    scale = 300.0
    man, recs = _run(cli, tmp_path, "--compute-model", "--compute-time-scale", scale)
    cm = man["compute_model"]
    spec = man["spec"]
    assert cm["time_scale"] == scale and len(spec["compute"]["devices"]) == 4
    assert [d["slowdown"] for d in spec["compute"]["devices"]] == [1, 1, SLOW, SLOW]
    cfg = get_model("tiny")
    prof = device_profiles(load_scenario(str(tmp_path / "half-slow.yaml")), dtype="fp32")
    # identity placement: stage j on device j; 4 micro-batches per iteration
    modelled = [scale * (4 * sum(compute.rank_phase_seconds(cfg, [2, 2, 2, 2], j, 1, prof[j], False)[k]
                                 for k in ("forward", "backward"))
                         + compute.rank_phase_seconds(cfg, [2, 2, 2, 2], j, 1, prof[j], False)["optimizer"])
                for j in range(4)]
    got = cm["rank_compute_seconds"]
    assert all(g >= 0.999 * m for g, m in zip(got, modelled)), (got, modelled)  # waits are never short
    assert modelled[2] == pytest.approx(SLOW * modelled[1])  # two middle stages: the same work
    assert sum(r["compute_overruns"] for r in recs) == cm["overrun_phases"]
    assert min(r["compute_seconds"] for r in recs) >= 0.999 * max(modelled)  # the busiest rank is a slow one
    # sim compare predicts the run from the device table at the run's scale: no calibration
    from harness.sim.compare import load_measured, simulate_run

    measured = load_measured(tmp_path / "res")
    assert measured[0]["compute_time_scale"] == scale
    seconds, busiest = simulate_run(measured[0])
    assert busiest == pytest.approx(max(modelled), rel=1e-9) and seconds >= busiest


def test_without_the_flag_nothing_is_paced(cli, tmp_path):
    man, recs = _run(cli, tmp_path)
    assert "compute_model" not in man and man["spec"]["compute"] == {"model": False, "time_scale": 1.0, "devices": []}
    assert all(r["compute_overruns"] == 0 for r in recs)


@pytest.mark.parametrize("system,flags", [("megatron", ("--pp", 4, "--dp", 1)),
                                          ("deepspeed", ("--zero", 1, "--pp", 4, "--dp", 1))])
def test_the_baselines_stage_modules_are_paced_through_hooks(cli, tmp_path, system, flags):
    scale = 1000.0
    scen = tmp_path / "half-slow.yaml"
    scen.write_text(textwrap.dedent(SCENARIO))
    rc, out, err = cli("run", "--scenario", scen, "--network", "none", "--system", system, *flags, "--batch", 4,
                       "--iters", 2, "--out", tmp_path / "res", "--compute-model", "--compute-time-scale", scale)
    assert rc == 0, err
    run = next((tmp_path / "res" / "half-slow").iterdir())
    cm = json.loads((run / "manifest.json").read_text())["compute_model"]
    cfg = get_model("tiny")
    prof = device_profiles(load_scenario(str(scen)), dtype="fp32")
    # rank order: stage j on device j; no recompute in these runtimes; 4 micro-batches
    per_mb = [sum(compute.rank_phase_seconds(cfg, [2, 2, 2, 2], j, 1, prof[j], False)[k]
                  for k in ("forward", "backward")) for j in range(4)]
    assert cm["rank_compute_seconds"] == pytest.approx([4 * scale * t for t in per_mb])
    # the pipeline cannot finish before its slowest stage has computed its modelled time
    for r in read_records(run):
        assert r["seconds"] >= 0.999 * 4 * scale * max(per_mb)


def test_layouts_with_collectives_inside_modules_refuse_the_model(cli):
    rc, out, err = cli("run", "--scenario", "5", "--devices", "8", "--network", "none", "--system", "megatron",
                       "--tp", 2, "--compute-model")
    assert rc == 2 and err.count("\n") == 1 and "tensor parallel or ZeRO-3" in err
