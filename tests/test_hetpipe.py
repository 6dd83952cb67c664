"""HetPipe in the simulator (Park et al. 2020): layer profiles from the architectures, the resource
allocation policies, partitions within memory, Wave Synchronous Parallel's clock bound, and the
direction of the paper's Figure 4 and Table 4 from first principles."""
from __future__ import annotations

import json

import numpy as np
import pytest

from harness.workloads import cnn
from harness.systems import hetpipe as hp
from harness.scenario import load_scenario
from harness.systems import horovod
from harness.systems.hetpipe import wsp

# torchvision's model tables: parameters and multiply-adds ("GFLOPS") of vgg19 and resnet152
TORCHVISION = {"vgg19": (143_667_240, 19.63e9), "resnet152": (60_192_808, 11.51e9)}


@pytest.fixture(scope="module")
def testbed():
    return load_scenario("hetpipe-testbed")


@pytest.mark.parametrize("name", sorted(TORCHVISION))
def test_layer_profiles_match_the_architectures(name):
    m = cnn.get_cnn(name)
    params, macs = TORCHVISION[name]
    assert m.params == params
    assert m.fwd_flop / 2 == pytest.approx(macs, rel=1e-3)
    assert m.layers[-1].out_values == cnn.CLASSES
    assert all(l.out_values > 0 and l.kept_values >= l.out_values for l in m.layers)


def test_vgg19_profile_counts_what_torch_builds():
    torch = pytest.importorskip("torch")
    from torch import nn

    layers, c = [], 3
    for v in cnn.VGG19_CONFIG:
        if v != "M":
            layers.append(nn.Conv2d(c, v, 3, padding=1))
            c = v
    body = nn.Sequential(*layers, nn.Linear(512 * 49, 4096), nn.Linear(4096, 4096), nn.Linear(4096, 1000))
    assert sum(p.numel() for p in body.parameters()) == cnn.vgg19().params
    with torch.no_grad():  # the activation each conv block hands on, on a quarter-size image (shapes scale)
        x = torch.zeros(1, 3, 56, 56)
        sizes = []
        for layer in layers[:4]:
            x = layer(x)
            sizes.append(x.numel())
    profile = [l.out_values for l in cnn.vgg19().layers if l.name.startswith("conv")][:4]
    assert [s * 16 for s in sizes[:2]] == profile[:2]  # 224^2 / 56^2 = 16


@pytest.mark.parametrize("gpus", [None, "VR8", "VRQ12"])
@pytest.mark.parametrize("policy", ["np", "ed", "hd"])
def test_policies_place_every_gpu_once(testbed, policy, gpus):
    devices = hp.select_gpus(testbed, gpus)
    if policy == "hd" and gpus == "VRQ12":
        with pytest.raises(hp.HetPipeError, match="even number of nodes"):
            hp.group(testbed, devices, policy)
        return
    groups = hp.group(testbed, devices, policy)
    assert sorted(d for g in groups for d in g) == devices
    nodes = [{testbed.device_region[d] for d in g} for g in groups]
    if policy == "np":
        assert all(len(n) == 1 for n in nodes) and len(groups) == len({testbed.device_region[d] for d in devices})
    if policy == "ed":
        assert all(len(g) == len(n) == len(nodes[0]) for g, n in zip(groups, nodes))  # one GPU of every node


def test_hd_pairs_the_nodes_that_balance_compute_and_memory(testbed):
    groups = hp.group(testbed, list(range(testbed.n)), "hd")
    kinds = sorted("".join(sorted(testbed.region_of(d).name for d in g)) for g in groups)
    assert kinds == ["GGRR", "GGRR", "QQVV", "QQVV"]  # the paper's VVQQ / RRGG, from the balance rule


def test_partitions_fit_memory_and_earlier_stages_keep_more(testbed):
    m = cnn.get_cnn("vgg19")
    groups = hp.group(testbed, list(range(testbed.n)), "ed")
    costs = hp.Costs.of(testbed, m, 32, groups)
    few, many = (hp.best_order(testbed, costs, groups[0], n) for n in (1, 6))
    for vw in (few, many):
        assert (np.array(vw.memory) <= np.array(vw.capacity)).all()
        assert vw.stages[0][0] == 0 and vw.stages[-1][1] == len(m.layers)
    assert many.memory[0] > few.memory[0]  # the first stage keeps every minibatch in flight
    with pytest.raises(hp.HetPipeError, match="cannot hold resnet152"):
        hp.partition(hp.Costs.of(testbed, cnn.get_cnn("resnet152"), 32, [[8]]), [8], 1)  # one RTX 2060: 6 GiB


@pytest.fixture(scope="module")
def np_workers(testbed):
    """NP's VWs for VGG-19: four pipelines of different speed (one per GPU type)."""
    m = cnn.get_cnn("vgg19")
    groups = hp.group(testbed, list(range(testbed.n)), "np")
    costs = hp.Costs.of(testbed, m, 32, groups)
    return hp.virtual_workers(testbed, costs, groups, 3)


@pytest.mark.parametrize("D", [0, 1, 3])
def test_wsp_never_lets_a_vw_run_more_than_D_ahead(np_workers, D):
    r = wsp.simulate(np_workers, 3, 32, D, push_seconds=0.05, pull_seconds=0.05, waves=16)
    V, W = r.push_done.shape
    gated = 0
    for v in range(V):
        for c in range(W):
            if not np.isnan(r.resumed[v, c]) and c >= D:
                # it resumed past clock c only with every VW's wave c - D pushed, and after pulling
                assert r.resumed[v, c] >= r.push_done[:, c - D].max() + 0.05 - 1e-12
                gated += 1
    assert gated > 0
    assert max(r.distance_at_resume) == D  # the bound holds and binds: the VWs differ in speed
    assert np.all(np.diff(r.wave_done, axis=1) > 0)


def test_a_runs_own_length_decides_whether_its_iterations_ever_pull(np_workers):
    """A measured run of D + 1 waves or fewer never reaches WSP's gate: its iterations are the pipeline's alone,
    as a run without the gate; a long run's later iterations pay the gate's push and pull, as the steady state."""
    D, N, per_vw = 3, 3, 3  # an iteration: one wave of every VW
    short = wsp.simulate(np_workers, N, 32, D, push_seconds=2.0, pull_seconds=2.0, waves=D + 1)
    free = wsp.simulate(np_workers, N, 32, 1000, push_seconds=2.0, pull_seconds=2.0, waves=D + 1)
    assert np.isnan(short.pulled).all()
    assert short.run_seconds(per_vw, 1, D) == pytest.approx(free.run_seconds(per_vw, 1, D))
    long = wsp.simulate(np_workers, N, 32, D, push_seconds=2.0, pull_seconds=2.0, waves=24)
    gated = long.run_seconds(per_vw, 12, 12)  # the second half, as the steady state is measured
    assert gated > short.run_seconds(per_vw, 1, D) + 1.0  # a push and a pull of 2 s each now bind
    assert gated == pytest.approx(long.seconds_per_wave, rel=0.05)  # one wave per iteration
    with pytest.raises(ValueError, match="the run had 30"):
        long.run_seconds(per_vw, 10, 20)


def test_without_the_gate_fast_vws_run_far_ahead(np_workers):
    r = wsp.simulate(np_workers, 3, 32, 1000, push_seconds=0.05, pull_seconds=0.05, waves=16)
    assert max(r.distance_at_resume, default=0) == 0  # never gated
    done = r.wave_done
    first_finished = done[:, -1].min()  # the fastest VW's last wave
    behind = [int(np.sum(done[v] <= first_finished)) for v in range(len(done))]
    assert done.shape[1] - min(behind) > 3 + 1  # the slowest VW is then far more than D=3 waves behind


@pytest.fixture(scope="module")
def evaluation():
    """The report's sweep: Figure 4 (every policy, ED-local and Horovod on 16 GPUs) and Table 4, D = 0."""
    from harness.systems.hetpipe import report as hetpipe_report

    return hetpipe_report.sweep()


@pytest.mark.parametrize("name", ["vgg19", "resnet152"])
def test_figure4_direction_ed_local_leads_and_beats_horovod(evaluation, name):
    row = {k: e.samples_per_s for k, e in evaluation.fig4[name].items()}
    assert row["ed-local"] >= 0.99 * max(row[p] for p in hp.POLICIES)  # equal to ED within 1% when sync hides
    assert row["ed-local"] > row["hd"] > row["np"]
    assert row["ed-local"] > row["horovod"]


def test_a_gpus_interface_limit_bounds_its_parameter_server_sync(testbed):
    from dataclasses import replace

    from harness.systems.hetpipe.planning import sync_seconds

    traffic = np.zeros((testbed.n, len(testbed.regions)))
    traffic[0, 1] = 1e9  # device 0 pushes 1 GB to node 1's shard
    free = sync_seconds(testbed, traffic)
    cap = np.full(testbed.n, np.inf)
    cap[0] = 0.8  # Gbps: one GPU's interface, slower than its node's link
    limited = sync_seconds(replace(testbed, interface_gbps=cap), traffic)
    delay = float(np.asarray(testbed.delay_ms).max()) / 1e3
    assert limited == pytest.approx(1e9 / (0.8e9 / 8) + delay) and limited > free
    assert sync_seconds(replace(testbed, interface_gbps=np.full(testbed.n, 1e4)), traffic) == free


def test_np_is_limited_by_its_smallest_memory_vw(testbed):
    m = cnn.get_cnn("resnet152")
    p = hp.plan(testbed, m, 32, "np")
    groups = hp.group(testbed, list(range(testbed.n)), "np")
    costs = hp.Costs.of(testbed, m, 32, groups)
    max_m = {testbed.region_of(g[0]).name: hp.max_in_flight(testbed, costs, g) for g in groups}
    assert min(max_m, key=max_m.get) == "G"  # the RTX 2060's 6 GiB bound N_m for every VW
    assert p.max_in_flight == max_m["G"] < max_m["R"]
    assert p.in_flight <= max_m["G"]


def test_table4_direction_whimpy_gpus_help_hetpipe_more(evaluation, testbed):
    for name in ("vgg19", "resnet152"):
        het = [evaluation.table4[name][g]["hetpipe"].samples_per_s for g in ("V4", "VR8", "VRQ12", "VRQG16")]
        hor = [evaluation.table4[name][g]["horovod"].samples_per_s for g in ("V4", "VR8", "VRQ12", "VRQG16")]
        assert het[0] < het[1] < het[2] < het[3]
        assert het[3] / het[0] > hor[3] / hor[0]
    assert horovod.simulate(testbed, cnn.get_cnn("resnet152"), 32).left_out == [8, 9, 10, 11]  # the RTX 2060s


def test_sim_report_hetpipe_section(evaluation, cli, tmp_path, monkeypatch):
    from harness.systems.hetpipe import report as hetpipe_report

    monkeypatch.setattr(hetpipe_report, "sweep", lambda progress=None: evaluation)  # computed once, above
    rc, out, err = cli("sim", "report", "--hetpipe-only", "--out", tmp_path)
    assert rc == 0, err
    text = (tmp_path / "report.md").read_text()
    doc = json.loads((tmp_path / "hetpipe.json").read_text())
    assert (tmp_path / "hetpipe.png").stat().st_size > 0
    for name in ("vgg19", "resnet152"):
        e, h = doc["fig4"][name]["ed-local"], doc["fig4"][name]["horovod"]
        assert f"| {e['samples_per_s'] / h['samples_per_s']:.2f}x |" in text
        assert f"{doc['table4'][name]['VRQG16']['hetpipe']['samples_per_s']:.0f} ({doc['table4'][name]['VRQG16']['hetpipe']['concurrent']})" in text


def test_sim_cli_writes_records_and_bad_inputs_are_one_line(cli, tmp_path):
    rc, out, err = cli("sim", "--scenario", "hetpipe-testbed", "--model", "resnet152", "--gpus", "VR8",
                       "--policy", "ed", "--out", tmp_path / "run", "--json", tmp_path / "r.json")
    assert rc == 0, err
    recs = json.loads((tmp_path / "r.json").read_text())
    assert {r["system"] for r in recs} == {"hetpipe", "horovod"}
    het = [r for r in recs if r["system"] == "hetpipe"]
    assert {r["config"]["placement"] for r in het} == {"default", "local"}
    for r in het:
        assert r["config"]["policy"] == "ed" and r["config"]["gpus"] == "VR8" and r["config"]["D"] == 0
        assert r["samples_per_s"] == pytest.approx(len(r["config"]["vws"]) * r["config"]["N_m"] * 32 / r["seconds"])
    assert json.loads((tmp_path / "run" / "records.json").read_text()) == recs
    for args, msg in [
        (("--policy", "xy"), "--policy: 'xy' is neither one of np, ed, hd"),
        (("--policy", "np", "--ps-placement", "local"), "--ps-placement local: layer stem is on nodes"),
        (("--placement", "local"), "--placement: the GPT baselines' placements; HetPipe's parameter server: --ps-placement"),
        (("--gpus", "VZ8"), "--gpus: 'VZ8' must be distinct node letters"),
        (("--policy", "8;9;10;11", "--gpus", "G4"), "virtual worker 8: cannot hold resnet152"),
        (("--system", "ours"), "--system: 'ours' does not train resnet152"),
    ]:
        rc, out, err = cli("sim", "--scenario", "hetpipe-testbed", "--model", "resnet152", "--out", tmp_path / "x", *args)
        assert rc == 2 and msg in err and err.count("\n") == 1, err
    rc, out, err = cli("sim", "--scenario", "1", "--policy", "ed", "--out", tmp_path / "y")
    assert rc == 2 and err.strip() == ("harness: error: --policy: an option of hetpipe, not of the systems `harness "
                                       "sim` runs on --model gpt3-xl here (ours, ours-random, megatron, deepspeed, "
                                       "dtfm, dtfm-random, diloco, streaming-diloco)")


@pytest.mark.parametrize("flag", [("--budget", "10"), ("--ps-mode", "rounds"), ("--protocol", "gloo"),
                                  ("--micro-batch", "2"), ("--seed", "1"), ("--no-cache",),
                                  ("--layers", "4"), ("--d-pp", "2"), ("--allocator", "optimal"),
                                  ("--scheduler", "random")])
def test_a_flag_the_cnn_workload_does_not_take_is_refused_not_ignored(cli, tmp_path, flag):
    rc, out, err = cli("sim", "--scenario", "hetpipe-testbed", "--model", "vgg19", *flag, "--out", tmp_path / "x")
    assert rc == 2 and err.strip() == (f"harness: error: {flag[0]}: not an option of --model vgg19 (workload cnn "
                                       "takes --batch, --gpus)")
    assert not (tmp_path / "x").exists()


def test_hetpipe_plan_prints_every_vw_stage_and_throughput(cli, tmp_path):
    rc, out, err = cli("hetpipe", "plan", "--scenario", "hetpipe-testbed", "--policy", "hd", "--model", "vgg19",
                       "--json", tmp_path / "p.json")
    assert rc == 0, err
    doc = json.loads((tmp_path / "p.json").read_text())
    assert len(doc["vws"]) == 4 and out.count("  stage ") == 16
    lay = doc["layout"]  # the VWs as a layout of pipelines per replica (what a real run will place)
    assert lay["dp"] == 4 and lay["pp"] == 4
    assert f"{doc['samples_per_s']:.1f} samples/s" in out


def test_a_calibrated_profile_speeds_the_cnn_systems(cli, tmp_path):
    from harness.compute.profiles import ComputeProfile, save_profiles

    save_profiles(tmp_path / "p.json", {"*": ComputeProfile("*", 0.0, {"transformer": 0.6, "lm_head": 0.6}, "test")})
    runs = {}
    for name, extra in (("default", ()), ("faster", ("--profile", tmp_path / "p.json"))):
        rc, out, err = cli("sim", "--scenario", "hetpipe-testbed", "--model", "resnet152", "--gpus", "VR8", "--policy",
                           "ed", "--ps-placement", "local", "--out", tmp_path / name, "--json", tmp_path / f"{name}.json",
                           *extra)
        assert rc == 0, err
        runs[name] = {r["system"]: r["samples_per_s"] for r in json.loads((tmp_path / f"{name}.json").read_text())}
    for system in ("hetpipe", "horovod"):
        assert runs["faster"][system] > 1.3 * runs["default"][system]


def test_the_traffic_between_nodes_each_runtime_sends_by_hand():
    """What an emulated run's count on the wire is held against (registry cross_node_bytes), by hand: two VWs of
    two stages, VW 0 on devices 0 (node 0) and 1 (node 1), VW 1 on 2 and 3 (both node 1); blocks 0 and 1's
    shards on devices 0 and 2."""
    from harness.compute import activation_bytes
    from harness.compute.model import get_model
    from harness.layout import WSP, from_replicas
    from harness.systems.hetpipe.sim import wsp_layout_cross_node_bytes
    from harness.workloads.gpt_layers import gpt_layer_profile

    cfg = get_model("tiny", 2)
    region = [0, 1, 1, 1]
    lay = from_replicas([((0, 1), ((0, 1), (1, 2))), ((2, 3), ((0, 1), (1, 2)))], placement="hand",
                        wsp=WSP(in_flight=2, staleness=0, ps_hosts=(0, 2)))
    batch, mb = 8, 1  # 4 minibatches a VW an iteration: 2 waves
    blocks = [layer.params * 4 for layer in gpt_layer_profile(cfg).layers]  # the updates and weights: fp32
    act = activation_bytes(cfg, mb, 2)
    # VW 0's one cut crosses (each minibatch: activations and their gradients); each wave device 1 pushes block 1 to
    # device 2's shard and pulls it back (node 1 both: nothing across), device 2 and 3 alike; device 2 pushes
    # block 0 to device 0 (node 0) and pulls it
    want = 4 * 2 * act + 2 * 2 * blocks[0]
    assert wsp_layout_cross_node_bytes(region, cfg, batch, lay, mb, 2) == pytest.approx(want)
    # a ring of 4 in rank order over nodes [0, 1, 1, 1] leaves node 0 once and comes back once
    grads = sum(blocks) / 4 * 2
    assert horovod.layout_cross_node_bytes(region, cfg, batch, lay, mb, 2) == pytest.approx(2 * 2 * 3 / 4 * grads)
    assert horovod.ring_cross_node_bytes([0, 0, 0], [0, 1, 2], 1e6) == 0
