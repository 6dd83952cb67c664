""""ours" (pipeline x data parallel) matches single-process training in fp32, for several layouts."""
from __future__ import annotations

import pytest
import torch

from harness.compute.model import get_model
from harness.compute import c_dp_bytes, c_pp_bytes
from harness.scenario import load_scenario
from harness import layout as layouts
from harness.layout import Layout
from harness.plan.request import RunSpec
from harness.train.gpt import GPT
from harness.train.local import local_spec, run_local
from harness.layout.schedule_order import stage_order
from harness.train.reference import reference_train

pytestmark = pytest.mark.timeout(120)

BATCH, MICRO, STEPS, SEED, LR = 8, 2, 3, 3, 0.1


def spec(layout: Layout, **kw) -> RunSpec:
    base = dict(name="tiny", batch=BATCH, micro_batch=MICRO, iters=STEPS, seed=SEED, lr=LR, timeout_s=60)
    return local_spec(layout, **{**base, **kw})


def identity_layout(d_pp: int, d_dp: int, **opts) -> Layout:
    """Replica i on devices i*d_pp .. i*d_pp + d_pp - 1, in stage order."""
    opts = {"schedule": "gpipe", "dp_sync": "sharded-ps", **opts}
    return layouts.from_pipelines([[i * d_pp + j for j in range(d_pp)] for i in range(d_dp)], 4, "identity", **opts)


@pytest.fixture(scope="module")
def reference():
    cfg = get_model("tiny", 4)
    losses, state = reference_train(cfg, BATCH, MICRO, STEPS, SEED, LR)
    return losses, state, GPT(cfg, SEED).state_dict()


def scheduled_layout() -> Layout:
    """A GA-scheduled placement on 4 devices of case 5 (Oregon, Virginia, Tokyo, London)."""
    from harness.scheduler import schedule

    topo = load_scenario("5", devices=8).subset([0, 1, 3, 5])
    cfg = get_model("tiny", 4)
    a = schedule(topo, 2, 2, c_pp_bytes(cfg, BATCH, 2, 4), c_dp_bytes(cfg, 2, 4), scheduler="ga", seed=0, budget=200)
    return layouts.from_pipelines(a.pipelines, 4, "ga", dp_sync="sharded-ps", schedule="1f1b")


LAYOUTS = {
    "pp2-gpipe": lambda: identity_layout(2, 1),
    "dp2-allreduce": lambda: identity_layout(1, 2, dp_sync="allreduce"),
    "pp2xdp2-sharded-ps-1f1b": lambda: identity_layout(2, 2, schedule="1f1b"),
    "pp2xdp2-allreduce-gpipe": lambda: identity_layout(2, 2, dp_sync="allreduce"),
    "scheduled-2x2": scheduled_layout,
    "permuted-4x1-1f1b": lambda: layouts.from_pipelines([[2, 0, 3, 1]], 4, "test", schedule="1f1b"),
    "uneven-3-1": lambda: layouts.from_pipelines([[1, 0]], 4, "test", stages=((0, 3), (3, 4))),
    "pp2xdp2-recompute": lambda: identity_layout(2, 2, recompute=True),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_matches_single_process_reference(name, reference):
    layout = LAYOUTS[name]()
    if name == "scheduled-2x2":
        assert layout.pipelines != identity_layout(2, 2).pipelines  # the placement is really permuted
    ref_losses, ref_state, init = reference
    run = run_local(spec(layout), collect_state=True, timeout_s=90)
    assert [s.loss for s in run.stats] == pytest.approx(ref_losses, rel=1e-5)
    state = run.state_dict()
    assert set(state) == set(ref_state)
    for k in ref_state:  # atol covers k.bias, whose true gradient is 0 (softmax shift invariance)
        torch.testing.assert_close(state[k], ref_state[k], rtol=1e-5, atol=1e-7, msg=k)
    # The updates themselves (not just the init) agree.
    num = sum(((state[k] - ref_state[k]) ** 2).sum() for k in ref_state).sqrt()
    den = sum(((ref_state[k] - init[k]) ** 2).sum() for k in ref_state).sqrt()
    assert den > 0 and num / den < 1e-5
    # Every replica holds identical parameters after the DP sync.
    by_rank = {r.rank: r.state for r in run.ranks}
    for j in range(layout.pp):
        group = layout.stage_group(j)
        for d in group[1:]:
            for k, v in by_rank[group[0]].items():
                assert torch.equal(v, by_rank[d][k]), (k, d)


def test_schedules_run_every_micro_batch_once_in_dependency_order():
    for schedule in ("gpipe", "1f1b"):
        for d_pp in (1, 2, 4):
            for j in range(d_pp):
                order = stage_order(schedule, d_pp, j, 6)
                assert sorted(order) == sorted([("F", k) for k in range(6)] + [("B", k) for k in range(6)])
                for k in range(6):
                    assert order.index(("F", k)) < order.index(("B", k))
    # 1F1B keeps at most d_pp - j micro-batches in flight
    order = stage_order("1f1b", 4, 0, 8)
    live = peak = 0
    for op, _ in order:
        live += 1 if op == "F" else -1
        peak = max(peak, live)
    assert peak == 4


def test_bad_layout_is_one_line_error():
    from harness.errors import HarnessError

    with pytest.raises(HarnessError, match="layout.mesh: must place every device"):
        layouts.from_pipelines([[0, 0]], 4, "test")


from harness.plan.systems import register_system  # noqa: E402
from harness.train.stats import IterationStats  # noqa: E402


@register_system("test-dp-sync")
def _dp_sync_modes(ctx, s):
    import torch.distributed as dist

    from harness.systems.ours.dp_sync import AllReduceSync, ShardedParameterServer, make_dp_sync

    members = [2, 0, 1]  # C_j in replica order, not rank order
    me = members.index(ctx.rank)
    flat = torch.arange(10, dtype=torch.float32) * (ctx.rank + 1) + 0.5
    ps = ShardedParameterServer(members, me)
    posted = ps.post(7, flat.numel(), flat.dtype, flat.device)
    a = ps.sync(flat.clone(), 7, posted)
    b = ps._sync_batched(flat.clone(), 8)  # the NCCL variant, here on gloo
    c = AllReduceSync(dist.new_group([0, 1, 2])).sync(flat.clone(), 9)
    by_name = {f"{ctx.rank}/{mode}-by-name": make_dp_sync(mode, [members], 0, me).sync(flat.clone(), 10 + k)
               for k, mode in enumerate(layouts.DP_SYNCS)}  # every name the layout accepts has its sync
    ctx.save_state({f"{ctx.rank}/ps": a, f"{ctx.rank}/batched": b, f"{ctx.rank}/allreduce": c, **by_name})
    return [IterationStats(0.0, 0.0, 0.0, float("nan"))]


def test_dp_sync_modes_give_the_group_sum_on_every_member():
    s = local_spec(layouts.in_rank_order(1, 1, 3, 2), "test-dp-sync", batch=3, iters=1, timeout_s=30)
    state = run_local(s, collect_state=True).state_dict()
    expected = torch.arange(10, dtype=torch.float32) * 6 + 1.5
    for r in range(3):
        for mode in ("ps", "batched", "allreduce", *(f"{m}-by-name" for m in layouts.DP_SYNCS)):
            torch.testing.assert_close(state[f"{r}/{mode}"], expected, msg=f"{r}/{mode}")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_mixed_precision_path_trains_close_to_reference(dtype, reference):
    """The GPU path's autocast, 2-byte activations/gradients on the wire and fp16 loss scaling,
    exercised on CPU: losses stay within mixed-precision tolerance of the fp32 reference."""
    run = run_local(spec(identity_layout(2, 2), dtype=dtype), timeout_s=90)
    assert [s.loss for s in run.stats] == pytest.approx(reference[0], rel=1e-3)


def test_planted_send_delay_and_no_overlap_slow_ours_down_and_leave_the_math_alone(reference):
    """The regression gate's planted regressions (debug section): every send of a 2-stage pipeline waits
    `delay` first, and completes before the stage computes on. The critical path holds each of the
    first stage's activation sends and each of the last stage's gradient sends: at least 2 x M delays."""
    delay, micro_batches = 0.05, BATCH // MICRO
    run = run_local(spec(identity_layout(2, 1), send_delay_s=delay, overlap=False), timeout_s=90)
    assert all(s.seconds >= 2 * micro_batches * delay for s in run.stats)
    assert [s.loss for s in run.stats] == pytest.approx(reference[0], rel=1e-5)
