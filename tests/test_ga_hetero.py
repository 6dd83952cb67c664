"""ga-hetero (issue 28): one scheduler for compute and network together, and the modelled iteration."""
import json

import numpy as np
import pytest

from harness.allocation import Problem, allocate
from harness.compute import c_dp_bytes, c_pp_bytes
from harness.scheduler.cost import CostModel
from harness.scheduler.iteration_cost import ComputeSetting, IterationModel
from harness.compute.model import get_model, stage_params
from harness.scenario import load_scenario
from harness.scheduler import Assignment, SchedulerError, schedule

from .test_scenario import write

# One fast site (identical links everywhere, compute dominates), four fast and four slow devices:
# the links cannot tell them apart, compute can.
TWO_KINDS = """
name: two-kinds
regions:
  - {name: fast, devices: 4, device: {gpu: A100}}
  - {name: slow, devices: 4, device: {gpu: T4}}
intra_region: {delay_ms: 0.01, bandwidth_gbps: 100}
inter_region: {delay_ms: 0.01, bandwidth_gbps: 100}
"""
CFG = get_model("gpt3-xl", 8)


def _model(topo, cfg, d_pp, d_dp, batch=64):
    comm = CostModel(topo, d_pp, d_dp, c_pp_bytes(cfg, batch, d_dp), c_dp_bytes(cfg, d_pp))
    return IterationModel(comm, ComputeSetting(cfg, batch))


def test_optimal_allocation_breaks_ties_towards_the_most_even_ranges():
    # identical devices, the last carries a head worth more than the others' whole share: any split of
    # the others is optimal for the bottleneck; the tie-break takes the one with the smallest largest range
    p = Problem(np.ones(4), np.ones(12), np.array([0, 0, 0, 100.0]), np.ones(12), np.full(4, 1e9))
    a = allocate("optimal", p)
    assert max(a.stage_seconds) == pytest.approx(101.0)
    assert max(a.layers_per_device) == 4  # 12 blocks over 4 devices with the last holding >= 1


def test_modelled_iteration_parts_follow_their_formulas(tmp_path):
    topo = load_scenario(write(tmp_path, TWO_KINDS))
    cfg = CFG
    model = _model(topo, cfg, 2, 4)
    pipes = np.array([[0, 4], [1, 5], [2, 6], [3, 7]])  # every pipeline: a fast then a slow device
    c = model.of_pipelines(pipes, allocator="optimal")
    t = np.array(c.stage_seconds)
    assert c.compute == pytest.approx(t.sum() + (c.micro_batches - 1) * t.max())
    assert c.micro_batches == 64 // 4
    # each stage's own c_dp: the data-parallel cost of stage j equals eq. 2 with c_dp = stage j's gradients
    counts = [b - a for a, b in c.stages]
    per_stage = []
    for j, params in enumerate(stage_params(cfg, counts)):
        cm = CostModel(topo, 2, 4, 1.0, params * 2)
        per_stage.append(cm.datap_cost_per_group(pipes.T)[j])
    assert c.dp == pytest.approx(max(per_stage))
    assert c.pp == pytest.approx(CostModel(topo, 2, 4, c_pp_bytes(cfg, 64, 4), 1.0).pipeline_cost(pipes)
                                 - CostModel(topo, 2, 4, c_pp_bytes(cfg, 64, 4), 1.0).datap_cost(pipes.T))
    assert c.total == pytest.approx(c.compute + c.dp + c.pp)
    # the fast stage takes more blocks than the slow one
    assert counts[0] > counts[1]


def test_ga_hetero_sorts_devices_the_links_cannot_tell_apart(tmp_path):
    topo = load_scenario(write(tmp_path, TWO_KINDS))
    cfg = CFG
    setting = ComputeSetting(cfg, 64)
    sizes = (c_pp_bytes(cfg, 64, 4), c_dp_bytes(cfg, 2))
    hetero = schedule(topo, 2, 4, *sizes, scheduler="ga-hetero", seed=0, budget=400, setting=setting)
    kinds = [{topo.profiles[d].gpu for d in group} for group in hetero.partition]
    assert sorted(map(sorted, kinds)) == [["A100"], ["T4"]]  # every stage of one kind
    for seed in (0, 1):
        ga_even = schedule(topo, 2, 4, *sizes, scheduler="ga", seed=seed, budget=400, setting=setting)
        ga_opt = schedule(topo, 2, 4, *sizes, scheduler="ga", seed=seed, budget=400, setting=setting,
                          allocator="optimal")
        assert hetero.model["iteration_s"] <= ga_opt.model["iteration_s"] + 1e-9
        assert hetero.model["iteration_s"] <= ga_even.model["iteration_s"] + 1e-9


def test_assignment_json_carries_layers_and_model_and_reads_old_files(tmp_path):
    topo = load_scenario("4", 16)
    cfg = get_model("gpt3-xl")
    a = schedule(topo, 4, 4, c_pp_bytes(cfg, 1024, 4), c_dp_bytes(cfg, 4), scheduler="ga", seed=0, budget=50,
                 setting=ComputeSetting(cfg, 1024), allocator="optimal")
    doc = json.loads(json.dumps(a.to_json()))
    assert len(doc["layers"]) == 4 and all(len(p) == 4 for p in doc["layers"])
    assert doc["layers"][0][0][0] == 0 and doc["layers"][0][-1][1] == cfg.layers
    assert set(doc["model"]) >= {"iteration_s", "compute_s", "dp_s", "pp_s", "fits_memory"}
    assert Assignment.from_json(doc).stages == tuple(tuple(s) for s in doc["layers"][0])
    old = {k: v for k, v in doc.items() if k not in ("layers", "model")}
    assert Assignment.from_json(old).stages is None


def test_ga_hetero_needs_the_model_and_its_own_allocator():
    topo = load_scenario("4", 16)
    with pytest.raises(SchedulerError, match="ga-hetero needs"):
        schedule(topo, 4, 4, 1e9, 1e9, scheduler="ga-hetero", budget=10)
    with pytest.raises(SchedulerError, match="--allocator"):
        schedule(topo, 4, 4, 1e9, 1e9, scheduler="ga-hetero", budget=10,
                 setting=ComputeSetting(get_model("gpt3-xl"), 1024), allocator="even")


def test_schedule_cli_prints_the_modelled_iteration_and_rejects_a_foreign_allocator(cli, tmp_path):
    out_json = tmp_path / "a.json"
    rc, out, err = cli("schedule", "--scenario", "hetero-regional", "--devices", "16", "--scheduler", "ga-hetero",
                       "--budget", "60", "--quiet", "--json", str(out_json))
    assert rc == 0, err
    assert "modelled iteration" in out and "blocks by optimal" in out
    doc = json.loads(out_json.read_text())
    assert doc["scheduler"] == "ga-hetero" and doc["model"]["allocator"] == "optimal"
    rc, out, err = cli("schedule", "--scenario", "4", "--scheduler", "ga-hetero", "--allocator", "even", "--quiet")
    assert rc != 0 and "--allocator" in err and len(err.strip().splitlines()) == 1


def test_sim_simulates_ours_on_ga_hetero_stages(cli, tmp_path):
    path = write(tmp_path, TWO_KINDS)
    out_json = tmp_path / "sim.json"
    rc, out, err = cli("sim", "--scenario", str(path), "--system", "ours", "--scheduler", "ga-hetero", "--model",
                       "gpt3-xl", "--layers", "8", "--batch", "64", "--d-pp", "2", "--budget", "200", "--no-cache",
                       "--out", str(tmp_path / "run"), "--json", str(out_json))
    assert rc == 0, err
    (rec,) = json.loads(out_json.read_text())
    cfg = rec["config"]
    assert cfg["scheduler"] == "ga-hetero" and cfg["allocator"] == "optimal"
    counts = [b - a for a, b in cfg["stages"]]
    kinds = [{load_scenario(path).profiles[p[j]].gpu for p in cfg["pipelines"]} for j in range(2)]
    assert all(len(k) == 1 for k in kinds)  # every stage of one kind
    fast = 0 if kinds[0] == {"A100"} else 1
    assert counts[fast] > counts[1 - fast]  # and the fast stage holds more blocks
    rc, out, err = cli("sim", "--scenario", str(path), "--system", "ours", "--scheduler", "ga-hetero",
                       "--allocator", "even", "--no-cache", "--out", str(tmp_path / "run2"))
    assert rc != 0 and "--allocator" in err


def test_run_plan_takes_ga_hetero_assignment_and_blocks(tmp_path):
    from harness.plan.request import LayoutRequest, ModelSection, NetworkSection, RunRequest, RunSection
    from harness.plan.layouts import resolve_layout

    path = write(tmp_path, TWO_KINDS)
    topo = load_scenario(path)
    req = RunRequest(network=NetworkSection(scenario=str(path), mode="none"),
                     model=ModelSection(name="gpt3-xl", layers=8, batch=64, dtype="fp16"),
                     run=RunSection(system="ours"),
                     layout=LayoutRequest(pp=2, dp=4, scheduler="ga-hetero", budget=200))
    lay, placement = resolve_layout(req, topo)
    a = schedule(topo, 2, 4, c_pp_bytes(CFG, 64, 4), c_dp_bytes(CFG, 2), scheduler="ga-hetero", seed=0, budget=200,
                 setting=ComputeSetting(CFG, 64, 1, "fp16", False))
    assert [list(p) for p in lay.pipelines] == a.pipelines
    assert tuple(lay.stages) == a.stages and len(set(lay.layers_per_stage)) == 2  # uneven, as chosen


def test_hetero_regional_8_is_the_emulated_check_and_ga_hetero_wins_there_in_the_simulator(cli, tmp_path):
    """The 8-device, two-type scenario of the emulated check: one A100 and one T4 per case-4 region,
    and ga-hetero's layout simulates clearly faster than the paper's GA with even blocks."""
    topo = load_scenario("hetero-regional-8")
    kinds = [p.gpu for p in topo.profiles]
    assert topo.n == 8 and sorted(set(kinds)) == ["A100", "T4"] and kinds.count("A100") == 4
    for first in range(0, 8, 2):  # the two halves of a region: the region's own 5 ms link, one of each kind
        assert topo.delay_ms[first][first + 1] == pytest.approx(5) and kinds[first] != kinds[first + 1]
    seconds = {}
    for scheduler in ("ga", "ga-hetero"):
        out_json = tmp_path / f"{scheduler}.json"
        rc, out, err = cli("sim", "--scenario", "hetero-regional-8", "--system", "ours", "--scheduler", scheduler,
                           "--model", "gpt3-xl", "--batch", "64", "--budget", "1000", "--no-cache",
                           "--out", str(tmp_path / scheduler), "--json", str(out_json))
        assert rc == 0, err
        (rec,) = json.loads(out_json.read_text())
        seconds[scheduler] = rec["seconds"]
    assert seconds["ga-hetero"] < 0.9 * seconds["ga"]
