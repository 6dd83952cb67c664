import json

import numpy as np
import pytest

from harness.scheduler.cost import CostModel
from harness.compute.model import get_model
from harness.compute import c_dp_bytes, c_pp_bytes
from harness.scenario import load_scenario
from harness.scheduler import SCHEDULERS, Assignment, SchedulerError, schedule
from harness.scheduler.exhaustive import balanced_partitions, count_partitions

from .conftest import random_topology

KEYS = ["scenario", "devices", "d_pp", "d_dp", "scheduler", "seed", "c_pp_gb", "c_dp_gb", "partition", "pipelines",
        "cost", "trace", "layers", "model", "bound", "gap", "plan"]


def test_registry_has_the_five_schedulers():
    assert set(SCHEDULERS) == {"random", "ga", "ga-kl", "exhaustive", "ga-hetero"}


@pytest.mark.parametrize("n,d_pp", [(8, 4), (8, 2), (12, 3), (9, 3)])
def test_exhaustive_enumerates_every_balanced_partition_once(n, d_pp):
    seen = {frozenset(frozenset(np.flatnonzero(l == g)) for g in range(d_pp)) for l in balanced_partitions(n, d_pp)}
    assert len(seen) == count_partitions(n, d_pp)


INSTANCES = [  # (topology, d_pp, d_dp): 8 to 12 devices, heterogeneous
    (lambda: load_scenario("5", devices=8), 4, 2),
    (lambda: load_scenario("4", devices=8), 2, 4),
    (lambda: random_topology(10, 7), 5, 2),
    (lambda: random_topology(12, 11), 3, 4),
    (lambda: random_topology(12, 12), 4, 3),
]


@pytest.mark.parametrize("instance", range(len(INSTANCES)))
def test_ga_reaches_the_exhaustive_optimum(instance):
    make, d_pp, d_dp = INSTANCES[instance]
    topo = make()
    sizes = (2e8, 1e8)
    best = schedule(topo, d_pp, d_dp, *sizes, scheduler="exhaustive")
    for seed in (0, 1, 2):
        a = schedule(topo, d_pp, d_dp, *sizes, scheduler="ga", seed=seed, budget=5000)
        assert a.cost["total"] == pytest.approx(best.cost["total"], rel=1e-9), f"seed {seed}"


def test_same_seed_same_output_and_budget_is_respected():
    topo = load_scenario("5", devices=16)
    cfg = get_model("gpt3-xl")
    args = (topo, 4, 4, c_pp_bytes(cfg, 1024, 4), c_dp_bytes(cfg, 4))
    for name in ("random", "ga", "ga-kl"):
        a, b = schedule(*args, scheduler=name, seed=3, budget=400), schedule(*args, scheduler=name, seed=3, budget=400)
        assert a.to_json() == b.to_json()
        assert a.trace[-1][0] == 400 and all(x[1] >= y[1] for x, y in zip(a.trace, a.trace[1:]))


def test_assignment_json_has_the_agreed_keys_and_is_consistent():
    topo = load_scenario("5", devices=8)
    a = schedule(topo, 4, 2, 1.0e9, 0.5e9, scheduler="ga", seed=0, budget=300)
    doc = json.loads(json.dumps(a.to_json()))
    assert list(doc) == KEYS
    assert doc["c_pp_gb"] == 1.0 and doc["c_dp_gb"] == 0.5
    P = np.array(doc["pipelines"])
    assert P.shape == (2, 4) and sorted(P.ravel()) == list(range(8))
    assert np.array_equal(np.array(doc["partition"]), P.T)
    cm = CostModel(topo, 4, 2, 1.0e9, 0.5e9)
    assert cm.pipeline_cost(P) == pytest.approx(doc["cost"]["total"])
    assert doc["cost"]["total"] == pytest.approx(doc["cost"]["dp"] + doc["cost"]["pp"])
    assert Assignment.from_json(doc).to_json() == doc


def test_ga_beats_random_on_the_worldwide_case():
    topo = load_scenario("5", devices=32)
    cfg = get_model("gpt3-xl")
    args = (topo, 8, 4, c_pp_bytes(cfg, 1024, 4), c_dp_bytes(cfg, 8))
    ga = schedule(*args, scheduler="ga", seed=0).cost["total"]
    kl = schedule(*args, scheduler="ga-kl", seed=0).cost["total"]
    rnd = schedule(*args, scheduler="random", seed=0).cost["total"]
    assert ga < 0.9 * min(kl, rnd)


def test_bad_requests():
    topo = random_topology(8, 0)
    with pytest.raises(SchedulerError, match="unknown scheduler 'sa'"):
        schedule(topo, 4, 2, 1.0, 1.0, scheduler="sa")
    with pytest.raises(SchedulerError, match="partitions"):
        schedule(load_scenario("5"), 8, 8, 1.0, 1.0, scheduler="exhaustive")


def test_cli_schedule_and_compare(cli, tmp_path):
    out = tmp_path / "a.json"
    rc, stdout, _ = cli("schedule", "--scenario", "5", "--devices", "8", "--budget", "200", "--json", out, "--quiet")
    assert rc == 0 and "COMM-COST" in stdout
    doc = json.loads(out.read_text())
    assert list(doc) == KEYS and doc["d_pp"] * doc["d_dp"] == 8 and doc["trace"][-1][0] == 200
    # the lower bound and the gap, in the JSON and the text
    assert 0 < doc["bound"]["total"] <= doc["cost"]["total"]
    assert doc["gap"] == pytest.approx((doc["cost"]["total"] - doc["bound"]["total"]) / doc["cost"]["total"])
    assert f"no layout below {doc['bound']['total']:.4f} s" in stdout and f"gap {doc['gap']:.1%}" in stdout
    m = doc["model"]
    assert 0 < m["bound"]["total"] <= m["iteration_s"] and m["gap"] >= 0
    rc, stdout, _ = cli("schedule", "compare", "--scenario", "4", "--devices", "8", "--budget", "100",
                        "--seed", "0", "1", "--out", tmp_path / "cmp")
    assert rc == 0 and "ga-kl" in stdout and "no layout below" in stdout
    final = (tmp_path / "cmp" / "final.csv").read_text().splitlines()
    assert final[0] == "scheduler,seed,dp_s,pp_s,total_s,bound_s,gap"
    for row in final[1:]:
        total, bound, gap = map(float, row.split(",")[-3:])
        assert bound <= total * (1 + 1e-12) and gap == pytest.approx((total - bound) / total)
    csv = (tmp_path / "cmp" / "compare.csv").read_text().splitlines()
    assert csv[0] == "scheduler,seed,candidates,best_total_s" and len(csv) > 6
    assert (tmp_path / "cmp" / "compare.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args,needle", [
    (["--scenario", "5", "--d-pp", "3"], "--d-pp 3: 3 stages x ? replicas do not make the 64 devices"),
    (["--scenario", "5", "--scheduler", "nope"], "unknown scheduler"),
    (["--scenario", "5", "--model", "gpt9"], "unknown model"),
    (["--scenario", "5", "--devices", "8", "--d-pp", "8", "--model", "gpt3-xl", "--layers", "4"], "cannot split"),
])
def test_cli_schedule_errors_are_one_line(cli, args, needle):
    rc, _, err = cli("schedule", *args, "--quiet")
    assert rc == 2 and needle in err and err.count("\n") == 1
