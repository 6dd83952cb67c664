"""HetPipe trained for real (`harness run --system hetpipe`, loopback): its plan as a layout, Wave Synchronous
Parallel's bounds checked from the run's own per-minibatch records, parity with the single-process
reference, failures that name the rank, and one-line refusals of bad input. Horovod beside it."""
from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import pytest
import torch

from harness.cli import main
from harness.cli.run_flags import run_request
from harness.plan.layouts import plan_run
from harness.results import read_minibatches, read_records
from harness.systems.hetpipe import wsp
from harness.systems.hetpipe.runtime import schedule
from harness.train.launch import RankFailure
from harness.train.local import run_local
from harness.train.reference import reference_train
from harness.workloads.gpt_layers import gpt_layer_profile

pytestmark = pytest.mark.timeout(300)

TESTBED = ["--scenario", "hetpipe-testbed", "--network", "none", "--model", "tiny"]


def plan(*flags):
    return plan_run(run_request(["--system", "hetpipe", *TESTBED, *flags]))


def only_run(root: Path) -> Path:
    dirs = [p for p in root.glob("hetpipe-testbed/*") if p.is_dir()]
    assert len(dirs) == 1
    return dirs[0]


# ----------------------------------------------------------------------------- the plan as a layout
@pytest.mark.parametrize("policy,placement", [("np", "default"), ("ed", "default"), ("ed", "local"),
                                              ("hd", "default"), ("0,1,2,3;4,5,6,7", "default")])
def test_every_policy_and_placement_plans_8_testbed_gpus(policy, placement):
    p = plan("--devices", "8", "--policy", policy, "--ps-placement", placement, "--staleness", "2")
    lay, doc = p.spec.layout, p.placement.to_json(p.spec.layout)
    assert lay.devices == 8 and lay.wsp.staleness == 2 and lay.wsp.ps_placement == placement
    assert sorted(d for pipe in lay.replica_pipelines() for d in pipe.devices) == list(range(8))
    assert [list(pipe.devices) for pipe in lay.replica_pipelines()] == doc["vws"]
    # 4 nodes of 2 GPUs (one type each): np makes one VW per node, ed one VW per GPU index, spanning all nodes
    if policy == "np":
        assert [{p.topo.device_region[d] for d in vw} for vw in doc["vws"]] == [{0}, {1}, {2}, {3}]
    if policy == "ed":
        assert all(sorted(p.topo.device_region[d] for d in vw) == [0, 1, 2, 3] for vw in doc["vws"])
    # a shard per node under default placement: its host is a device of that node
    for b, host in enumerate(lay.wsp.ps_hosts):
        assert p.topo.regions[p.topo.device_region[host]].name == doc["ps_nodes"][b]
    assert doc["N_m"] == lay.wsp.in_flight <= 8 // (lay.dp * 1)  # at most one iteration's minibatches


def test_local_placement_keeps_each_block_on_the_node_that_runs_it():
    p = plan("--devices", "8", "--policy", "ed", "--ps-placement", "local")
    lay = p.spec.layout
    for pipe in lay.replica_pipelines():
        for dev, (a, b) in zip(pipe.devices, pipe.stages):
            for blk in range(a, b):
                assert p.topo.device_region[lay.wsp.ps_hosts[blk]] == p.topo.device_region[dev]


@pytest.mark.parametrize("flags,message", [
    (["--policy", "0,1,2,3;4,5,6"], "--policy: device 7 is in no virtual worker"),
    (["--policy", "0,2,4;1,3,5,6,7", "--ps-placement", "local"], "--ps-placement local: layer block"),
    (["--ps-placement", "nearest"], "--ps-placement: must be one of default, local (got 'nearest')"),
    (["--batch", "7"], "--batch 7: does not split into 2 virtual workers"),
    (["--model", "gpt3-13b", "--in-flight", "8"], "--in-flight 8: N_m too large"),
])
def test_bad_input_is_one_line(tmp_path, capsys, flags, message):
    assert main(["run", "--system", "hetpipe", *TESTBED, "--devices", "8", "--results", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not list(tmp_path.rglob("manifest.json"))  # refused before anything was written


def test_negative_staleness_and_foreign_flags_are_refused(capsys):
    assert main(["run", "--system", "hetpipe", *TESTBED, "--staleness", "-1"]) == 2
    assert "--staleness: must be an integer >= 0 (got '-1')" in capsys.readouterr().err
    assert main(["run", "--system", "ours", *TESTBED, "--staleness", "1"]) == 2
    assert "--staleness: not an option of --system ours" in capsys.readouterr().err
    # hetpipe's options are its registry entry's: `harness run` takes them from there, the old spelling with a note
    assert run_request(["--system", "hetpipe", *TESTBED, "--placement", "local"]).run.options == {
        "policy": "ed", "ps_placement": "local", "staleness": 0, "in_flight": None}
    assert "--placement is deprecated, use --ps-placement" in capsys.readouterr().err


@pytest.mark.parametrize("stages,in_flight,minibatches", [(1, 3, 5), (2, 1, 4), (4, 3, 7), (3, 5, 2)])
def test_schedule_keeps_n_m_in_flight(stages, in_flight, minibatches):
    for k in range(stages):
        order = schedule(k, stages, in_flight, minibatches)
        fwd = [p for op, p in order if op in ("F", "FB")]
        bwd = [p for op, p in order if op in ("B", "FB")]
        assert fwd == bwd == list(range(minibatches))
        done = 0
        for op, p in order:  # a forward never runs N_m or more ahead of the backwards done
            if op == "F":
                assert p - done < in_flight
            done += op != "F"


# ----------------------------------------------------------------------------- runs
def run(tmp_path: Path, *flags) -> Path:
    assert main(["run", "--system", "hetpipe", *TESTBED, "--results", str(tmp_path), *flags]) == 0
    return only_run(tmp_path)


@pytest.mark.parametrize("policy,in_flight,staleness", [("np", 2, 0), ("ed", 3, 1), ("hd", 1, 2)])
def test_wsp_bounds_hold_in_real_runs_with_random_device_speeds(tmp_path, policy, in_flight, staleness):
    d = run(tmp_path, "--devices", "8", "--layers", "4", "--policy", policy, "--in-flight", str(in_flight),
            "--staleness", str(staleness), "--batch", "24" if policy == "np" else "12", "--iters", "2",
            "--warmup", "1", "--data", "markov", "--debug", "jitter_s=0.01")
    man = json.loads((d / "manifest.json").read_text())
    vws = len(man["placement"]["vws"])
    rows = read_minibatches(d / "minibatches.csv")
    per_vw = (24 if policy == "np" else 12) // vws * 3
    assert sorted((r["vw"], r["minibatch"]) for r in rows) == [(v, p) for v in range(vws) for p in range(per_vw)]
    records = [wsp.MinibatchRecord.of_row(r) for r in rows]
    assert wsp.check_bounds(records, in_flight, staleness) == []
    # the gates ran: late minibatches read global weights holding waves of every VW
    assert max(r.global_version for r in records) >= per_vw // in_flight - staleness - 2 > 0
    waves = per_vw // in_flight
    assert sum(not math.isnan(r.pushed) for r in records) == vws * waves
    assert all(0 < r.loss < 10 for r in records)
    recs = read_records(d / "records.csv")
    assert [r["iteration"] for r in recs] == [1, 2] and all(r["seconds"] > 0 for r in recs)


def test_one_vw_one_in_flight_matches_the_reference():
    """One VW over the 4 nodes, N_m = 1, D = 0: every minibatch is a wave, pushed to 4 shards and pulled;
    the weights are the reference's SGD steps on the same samples (fp32; the shards' sums round at the last
    bit)."""
    p = plan("--devices", "4", "--layers", "4", "--policy", "0,1,2,3", "--in-flight", "1", "--staleness", "0",
             "--batch", "2", "--micro-batch", "2", "--iters", "3", "--warmup", "1", "--data", "markov")
    assert p.spec.layout.dp == 1 and p.spec.layout.pp == 4 and len(p.spec.layout.wsp.shard_hosts) == 4
    run_ = run_local(p.spec, collect_state=True)
    ref_losses, ref_state = reference_train(p.spec.cfg, 2, 2, 4, seed=0, lr=0.1, data="markov")
    state = run_.state_dict()
    assert set(state) == set(ref_state)
    for k in ref_state:
        torch.testing.assert_close(state[k], ref_state[k], rtol=1e-5, atol=1e-6, msg=k)
    assert [s.loss for s in run_.stats] == pytest.approx(ref_losses[1:], rel=1e-5)


def test_bytes_on_the_wire_count_the_parameter_server(tmp_path):
    """One VW over the 4 nodes, N_m = 1, D = 0, two minibatches: every stage pushes its blocks (fp32) after
    each, pulls them back before the second, and the pipeline moves an activation and a gradient across
    each of its 3 cuts per minibatch. The ranks' counts (debug.count_wire: payload only) add up to exactly
    that, the shards' replies and the last pushes (after the last iteration) included."""
    d = run(tmp_path, "--devices", "4", "--layers", "4", "--policy", "0,1,2,3", "--in-flight", "1", "--batch", "2",
            "--micro-batch", "2", "--iters", "2", "--warmup", "0", "--debug", "count_wire=1")
    per_rank = json.loads((d / "manifest.json").read_text())["wire_bytes_per_rank"]
    cfg = plan("--devices", "4", "--layers", "4").spec.cfg
    model = 4 * sum(layer.params for layer in gpt_layer_profile(cfg).layers)
    act = 2 * cfg.seq * cfg.hidden * 4
    assert sum(map(sum, per_rank)) == 2 * model + model + 2 * 2 * 3 * act
    # the model of its traffic between nodes (registry cross_node_bytes; every cut and shard crosses here) says the
    # same of a steady iteration, one push and one pull a wave: the run's first wave pulled nothing
    from harness.sim.compare import cross_node_traffic

    man = json.loads((d / "manifest.json").read_text())
    man["egress"] = {"iterations": 2, "bytes": [[0, 5, 0, 1], [7, 0, 0, 0], [0, 0, 0, 0], [0, 0, 3, 0]]}
    (d / "manifest.json").write_text(json.dumps(man))  # as an emulated run's kernels would have counted
    counted, payload = cross_node_traffic(d)
    assert 2 * payload - model == sum(map(sum, per_rank))
    assert counted == (5 + 1 + 7 + 3) / 2  # one GPU of each node: every pair crosses


TWO_GPUS = """\
name: two-gpus
device: {gpu: V100}
regions:
  - {name: A, devices: 2}
intra_region: {delay_ms: 0.01, bandwidth_gbps: 10}
inter_region: {delay_ms: 0.01, bandwidth_gbps: 10}
"""


def test_a_pipeline_with_minibatches_in_flight_stashes_weights_and_updates_locally(tmp_path):
    """One VW of 2 stages, N_m = 2, D beyond the run (no pull: the shards never change the weights). Stage 0
    runs F0 F1 B0 F2 B1 F3 ...: minibatch p's forward there reads the weights updated up to p - 2 and its
    backward reuses them (stashed); the last stage runs each minibatch's forward and backward at once, on
    its weights updated up to p - 1. Computed here in one process, the run's final weights are the same."""
    from harness.train.gpt import GPT, lm_loss, synthetic_batch
    from harness.train.reference import make_optimizer

    scen = tmp_path / "two.yaml"
    scen.write_text(TWO_GPUS)
    p = plan_run(run_request(["--system", "hetpipe", "--scenario", str(scen), "--network", "none", "--model", "tiny",
                              "--layers", "2", "--policy", "0,1", "--in-flight", "2", "--staleness", "50",
                              "--batch", "4", "--micro-batch", "1", "--iters", "2", "--warmup", "0",
                              "--data", "markov"]))
    lay = p.spec.layout
    assert lay.pipeline(0).stages == ((0, 1), (1, 2)) and lay.wsp.in_flight == 2
    cfg, P = p.spec.cfg, 8  # 2 iterations x 4 minibatches
    got = run_local(p.spec, collect_state=True).state_dict()

    model = GPT(cfg, 0)
    s0, s1 = model.stage(0, 1), model.stage(1, 2)
    opt0, opt1 = make_optimizer(s0.parameters(), 0.1), make_optimizer(s1.parameters(), 0.1)
    data = [synthetic_batch(cfg, 4, it, 0, "markov") for it in range(2)]
    mb = lambda q: tuple(t[q % 4:q % 4 + 1] for t in data[q // 4])  # noqa: E731

    def forward0(q):
        snap = {n: w.detach().clone().requires_grad_(True) for n, w in s0.named_parameters()}
        return snap, torch.func.functional_call(s0, snap, (mb(q)[0],))

    def fb1(act):  # the last stage on its current weights; the gradient of its input
        x = act.detach().requires_grad_(True)
        opt1.zero_grad()
        lm_loss(s1(x), mb(q)[1]).backward()
        opt1.step()
        return x.grad

    fwd = {q: forward0(q) for q in range(2)}
    for q in range(P):
        snap, out = fwd.pop(q)
        g = fb1(out)
        out.backward(g)
        for n, w in s0.named_parameters():
            w.grad = snap[n].grad
        opt0.step()
        if q + 2 < P:
            fwd[q + 2] = forward0(q + 2)
    want = dict(model.named_parameters())
    for k, v in want.items():
        torch.testing.assert_close(got[k], v.detach(), rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("fault_device,named", [(3, r"rank 3 \(stage 1 of pipeline 1\)"),
                                                (2, r"rank 2 \(stage 0 of pipeline 1; parameter-server shard")])
def test_a_dead_vw_rank_or_shard_fails_the_run_naming_it(fault_device, named):
    """8 testbed GPUs (4 nodes x 2), np: a VW of 2 stages per node; devices 0, 2, 4, 6 host the nodes' shards."""
    p = plan("--devices", "8", "--layers", "4", "--policy", "np", "--batch", "8", "--iters", "100000",
             "--warmup", "0", "--debug", f"fault_rank={fault_device}", "--debug", "fault_after_s=3")
    assert p.spec.layout.wsp.shard_hosts == (0, 2, 4, 6)
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as e:
        run_local(p.spec, timeout_s=90)
    assert time.monotonic() - t0 < 60
    assert re.match(named + r".* was killed by signal SIGKILL", str(e.value)), str(e.value)


def test_sim_compare_predicts_compute_model_runs(tmp_path):
    """Paced to the testbed's GPUs (x1000: a CPU rank computes within its modelled time), HetPipe's run is
    what the WSP simulation of its layout says, and Horovod's what the baselines' model says: no calibration.
    On loopback the links are free; the emulated proof (issue 53's note) shapes them."""
    from harness.sim.compare import compare, load_measured

    common = [*TESTBED, "--devices", "8", "--layers", "4", "--batch", "16", "--iters", "2", "--compute-model",
              "--compute-time-scale", "1000", "--results", str(tmp_path)]
    assert main(["run", "--system", "hetpipe", "--policy", "ed", "--ps-placement", "local", *common]) == 0
    assert main(["run", "--system", "horovod", *common]) == 0
    measured = load_measured(tmp_path)
    horovod = [r for r in measured if r["system"] == "horovod"]  # every device a replica of the whole model
    assert {(r["d_pp"], r["d_dp"], r["d_tp"]) for r in horovod} == {(1, 8, 1)} and len(horovod) == 2
    rows = {c.system: c for c in compare(measured)}
    assert set(rows) == {"hetpipe", "horovod"}
    for c in rows.values():
        assert abs(c.error) < 0.25, (c.system, c.measured_s, c.simulated_s)
