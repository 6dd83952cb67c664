"""The compute model: a rank's phases take what its device profile gives, overruns are counted, and the
simulator predicts a compute-model run from the device table."""
import json
import textwrap
import time

import numpy as np
import pytest
import torch

from harness import compute
from harness.compute.model import get_model, stage_params
from harness.compute.profiles import ComputeProfile, device_profiles
from harness.results import read_records
from harness.scenario import load_scenario
from harness.train.compute_model import ComputePacer, pace_stage_module
from harness.plan.request import ComputeSection, ConfigError

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
    it = pacer.take_iteration()
    assert it["compute_overruns"] == 1 and it["compute_late_seconds"] >= 0.019  # the overrun is late by its excess
    assert pacer.take() == 0 and pacer.total_overruns == 1 and pacer.phases == 2


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
                       "--iters", 2, "--results", tmp_path / "res", "--scheduler", "identity", *extra)
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
    assert "compute_model" not in man and man["spec"]["compute"] == {"model": False, "time_scale": 1.0, "devices": [], "dilate": False}
    assert all(r["compute_overruns"] == 0 for r in recs)


class _SlowCollective(torch.autograd.Function):
    """Stands for a collective a parallelism library runs in a module hook: slow both ways."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        time.sleep(seconds)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None


def test_collectives_in_submodule_hooks_are_not_paced_as_compute():
    model, comm = 0.2, 0.3
    inner = torch.nn.Linear(4, 4)
    # as FSDP2's all-gather (pre-hook) and TP's all-reduce (hook), each with a backward of its own
    inner.register_forward_pre_hook(lambda mod, args: (_SlowCollective.apply(args[0], comm),))
    inner.register_forward_hook(lambda mod, args, out: _SlowCollective.apply(out, comm))
    stage = torch.nn.Sequential(inner)
    pacer = ComputePacer({"forward": model, "backward": model})
    pace_stage_module(stage, pacer)
    x = torch.randn(2, 4, requires_grad=True)
    t0 = time.perf_counter()
    out = stage(x)
    t1 = time.perf_counter()
    out.sum().backward()
    t2 = time.perf_counter()
    # each phase: its modelled compute, then the two collectives on top; none is an overrun
    assert t1 - t0 >= model + 2 * comm and t2 - t1 >= model + 2 * comm
    assert pacer.take() == 0 and pacer.phases == 2 and x.grad is not None


def test_a_paced_backward_makes_each_blocks_gradients_ready_when_the_device_would():
    """The real backward is over in moments; paced, a block's parameter gradients are ready at its share of the
    modelled backward (head, then blocks from the last), where a runtime that reduces them as they come (DDP's
    buckets) sees them on the device, not all at the phase's start."""
    from harness.train.gpt import GPT

    cfg = get_model("tiny")
    split = [4, 4]
    stage = GPT(cfg).stage(4, 8)  # the last stage: 4 blocks and the head
    profile = ComputeProfile("V100", 15.7, {"transformer": 0.3, "lm_head": 0.3})
    shares = compute.backward_shares(cfg, split, 1, 1, profile, recompute=False)
    bwd = compute.stage_compute(cfg, split, 1, [profile], np.zeros(2, dtype=int), recompute=False)[1]
    assert len(shares) == 5 and shares[-1] == pytest.approx(1.0) and all(a < b for a, b in zip(shares, shares[1:]))
    blocks_only = compute.stage_compute(cfg, split, 1, [profile], np.zeros(2, dtype=int), recompute=False,
                                        lm_head=False)[1][1]
    assert shares[0] == pytest.approx(1 - blocks_only / bwd[1])  # the head's share, then equal blocks
    assert np.diff(shares[1:]) == pytest.approx([blocks_only / bwd[1] / 4] * 3)
    # a block's share: about 0.4 s, which its real backward (milliseconds, a few hundred on a loaded machine) does
    # not fill; the forward's second too (its first call allocates), so that no phase overruns
    modelled = 2.0
    pacer = ComputePacer({"forward": 1.0, "backward": modelled}, backward_shares=shares)
    pace_stage_module(stage, pacer)
    ready: dict[int, float] = {}

    def note(k):
        def hook(_param) -> None:  # as DDP's: called once the parameter's gradient is accumulated
            ready.setdefault(k, time.perf_counter())
        return hook
    for k, block in enumerate(stage.blocks):
        block.ln1.weight.register_post_accumulate_grad_hook(note(k))
    out = stage(torch.randn(1, cfg.seq, cfg.hidden, requires_grad=True))
    t0 = time.perf_counter()
    out.float().mean().backward()
    end = time.perf_counter() - t0
    # block k (backward order: head, block 3, 2, 1, 0) is ready once its share of the backward has passed (the
    # old pacing had them all at t0); the first block's right after the piece before it, the phase's end after
    for k in (3, 2, 1):
        assert ready[k] - t0 >= shares[4 - k] * modelled
    assert ready[0] - t0 >= shares[3] * modelled and end >= modelled
    assert ready[3] - t0 < shares[2] * modelled  # and no later than the next piece's share: not at the end
    assert pacer.take() == 0


def _baseline_run(cli, tmp_path, system, flags, scale):
    scen = tmp_path / "half-slow.yaml"
    scen.write_text(textwrap.dedent(SCENARIO))
    rc, out, err = cli("run", "--scenario", scen, "--network", "none", "--system", system, *flags, "--batch", 4,
                       "--iters", 1, "--warmup", 0, "--results", tmp_path / "res", "--compute-model",
                       "--compute-time-scale", scale)  # one iteration: what is asserted holds in each
    assert rc == 0, err
    run = next((tmp_path / "res" / "half-slow").iterdir())
    man = json.loads((run / "manifest.json").read_text())
    return man["compute_model"], read_records(run), device_profiles(load_scenario(str(scen)), dtype="fp32")


@pytest.mark.parametrize("system,flags", [("megatron", ("--pp", 4, "--dp", 1)),
                                          ("deepspeed", ("--zero", 1, "--pp", 4, "--dp", 1))])
def test_the_baselines_stage_modules_are_paced_through_hooks(cli, tmp_path, system, flags):
    scale = 1000.0
    cm, recs, prof = _baseline_run(cli, tmp_path, system, flags, scale)
    cfg = get_model("tiny")
    # rank order: stage j on device j; no recompute in these runtimes; 4 micro-batches, then the step
    phases = [compute.rank_phase_seconds(cfg, [2, 2, 2, 2], j, 1, prof[j], False) for j in range(4)]
    per_mb = [p["forward"] + p["backward"] for p in phases]
    assert cm["rank_compute_seconds"] == pytest.approx([scale * (4 * t + p["optimizer"])
                                                        for t, p in zip(per_mb, phases)])
    # the pipeline cannot finish before its slowest stage has computed its modelled time
    for r in recs:
        assert r["seconds"] >= 0.999 * 4 * scale * max(per_mb)


@pytest.mark.parametrize("system,flags,split,tp,shards", [
    ("megatron", ("--tp", 2, "--pp", 2, "--dp", 1), [4, 4], 2, 1),  # stage j on devices 2j, 2j+1
    ("deepspeed", ("--zero", 3, "--dp", 4), [8], 1, 4),  # every device a replica, 1 micro-batch each
])
def test_tensor_parallel_and_zero3_ranks_take_their_modelled_time(cli, tmp_path, system, flags, split, tp, shards):
    scale = 3000.0
    cm, recs, prof = _baseline_run(cli, tmp_path, system, flags, scale)
    cfg = get_model("tiny")
    stages = len(split)
    replicas = 4 // (tp * stages)
    micro = 4 // replicas  # micro-batches of a replica (batch 4, micro-batch 1)
    # a tensor rank does 1/tp of the blocks, the whole head (replicated here), and ZeRO shards the step
    want = []
    for d in range(4):
        p = compute.rank_phase_seconds(cfg, split, d * stages // 4, 1, prof[d], False, tp, vocab_parallel=False,
                                       optimizer_shards=shards)
        want.append(scale * (micro * (p["forward"] + p["backward"]) + p["optimizer"]))
    assert cm["rank_compute_seconds"] == pytest.approx(want)
    assert want[3] > want[0]  # devices 2 and 3 are the slow ones
    # the run waits for its slowest rank's modelled compute
    for r in recs:
        assert r["seconds"] >= 0.999 * max(want)
