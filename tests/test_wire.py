"""Bytes on the wire (harness/train/wire.py): counted where every runtime calls the process group, and
equal to what the cost model says each rank sends (eqs. 1-2 of Yuan et al. 2022: activations and their
gradients between stages, 2 (D_DP - 1) / D_DP of a stage's gradients inside its data-parallel group)."""
from __future__ import annotations

import pytest

from harness import layout as layouts
from harness.compute import c_pp_bytes
from harness.compute.model import get_model, stage_params
from harness.train.local import local_spec, run_local

pytestmark = pytest.mark.timeout(180)

BATCH, MICRO, FP32 = 8, 1, 4


def counted(layout, system: str = "ours", **kw) -> dict[int, list[int]]:
    """Each rank's (= device's) bytes on the wire in each of 2 timed iterations of a loopback run."""
    spec = local_spec(layout, system, name="tiny", batch=BATCH, micro_batch=MICRO, iters=2, warmup=1,
                      timeout_s=90, count_wire=True, **kw)
    return {r.rank: [s.wire_bytes for s in r.stats] for r in run_local(spec).ranks}


def pipelines(pp: int, dp: int, **opts):
    return layouts.from_pipelines([[i * pp + j for j in range(pp)] for i in range(dp)], 4, "identity", **opts)


def test_ours_sends_what_the_cost_model_assumes_and_both_dp_syncs_send_the_same():
    cfg = get_model("tiny", 4)
    lay = pipelines(2, 2, schedule="1f1b", dp_sync="sharded-ps")
    got = counted(lay)
    act = c_pp_bytes(cfg, BATCH, lay.dp, FP32)  # one direction, one pipeline, one iteration
    grads = stage_params(cfg, lay.layers_per_stage)
    for stage in range(lay.pp):
        want = 2 * (lay.dp - 1) / lay.dp * grads[stage] * FP32 + act * (stage > 0) + act * (stage < lay.pp - 1)
        for device in lay.stage_group(stage):
            assert got[device] == [want, want], (stage, device)
    # the parameter server's point-to-point exchange moves the bytes of a ring all-reduce
    assert counted(pipelines(2, 2, schedule="1f1b", dp_sync="allreduce")) == got


def test_without_overlap_every_message_is_acknowledged_by_its_receiver():
    """The planted no-overlap regression (debug.overlap=0) makes each pipeline send a rendezvous: the
    receiver sends a one-value delivery note back for every activation and gradient it takes."""
    lay = pipelines(2, 2, schedule="gpipe", dp_sync="sharded-ps")
    plain, rendezvous = counted(lay), counted(lay, overlap=False)
    notes = BATCH // lay.dp // MICRO * FP32  # one fp32 value per micro-batch and direction
    assert {d: [b - a for a, b in zip(plain[d], rendezvous[d])] for d in plain} == {d: [notes, notes] for d in plain}


def test_uncounted_runs_report_no_bytes():
    spec = local_spec(pipelines(2, 1), "ours", name="tiny", batch=4, micro_batch=1, iters=1, timeout_s=60)
    assert all(s.wire_bytes is None for r in run_local(spec).ranks for s in r.stats)


def test_the_baselines_count_their_collectives_and_pipeline_sends():
    """Megatron's layout with the same stages: DDP's all-reduce and the pipelining schedule's sends
    are counted at the process group and come to ours' bytes (up to a few small control messages);
    ZeRO-3 all-gathers the parameters (again for every micro-batch: the schedule runs the module once
    per micro-batch and FSDP frees them after each) and reduce-scatters the gradients, (D_DP - 1) / D_DP
    of them each time, alike on every rank."""
    ours = counted(pipelines(2, 2, schedule="1f1b", dp_sync="allreduce"))
    mega = counted(layouts.in_rank_order(1, 2, 2, 4), "megatron")
    lay = layouts.in_rank_order(1, 2, 2, 4)
    for stage in range(2):
        o = ours[stage]  # ours' identity layout: device = i * pp + j; rank order: device = j * dp + i
        for device in lay.stage_group(stage):
            assert mega[device][0] == mega[device][1]
            assert mega[device][0] == pytest.approx(o[0], rel=1e-3)
    cfg = get_model("tiny", 4)
    zero3 = counted(layouts.in_rank_order(1, 1, 4, 4, zero=3), "deepspeed")
    params = stage_params(cfg, 1)[0] * FP32
    micro = BATCH // 4 // MICRO
    assert len({x for its in zero3.values() for x in its}) == 1
    assert (1 + 1) * 3 / 4 * params <= zero3[0][0] <= (2 * micro + 1) * 3 / 4 * params


@pytest.mark.parametrize("codec", ["cocktail", "int8", "fp8:quant_bucket_size=64"])
def test_a_compressed_exchange_sends_what_its_formula_says(codec):
    """Each member's bytes: the activations as before, and its messages of the sharded parameter server as
    compute/compression.py counts them (a quarter of fp32's or less); none counts fp32's, as the plain run sends."""
    from harness.compute.compression import NONE, Compression

    cfg = get_model("tiny", 4)
    c = Compression.parse(codec)
    lay = pipelines(2, 2, schedule="gpipe", dp_sync="sharded-ps", dp_compress=codec)
    got, plain = counted(lay), counted(pipelines(2, 2, schedule="gpipe", dp_sync="sharded-ps"))
    grads = stage_params(cfg, lay.layers_per_stage)
    for stage in range(lay.pp):
        for me, device in enumerate(lay.stage_group(stage)):
            act = plain[device][0] - NONE.sent_bytes(grads[stage], lay.dp, me)
            assert got[device] == [act + c.sent_bytes(grads[stage], lay.dp, me)] * 2, (stage, device)
            assert c.sent_bytes(grads[stage], lay.dp, me) < NONE.sent_bytes(grads[stage], lay.dp, me) / 3


@pytest.mark.parametrize("codec", ["none", "cocktail"])
def test_ours_payload_model_between_nodes_is_what_its_ranks_send(codec):
    """Every device a node of its own: every byte crosses, so the model (registry cross_node_bytes, what `sim
    compare` holds an emulated run's count against) is the sum of the ranks' counted bytes; one node: nothing."""
    from harness.plan import systems

    cfg = get_model("tiny", 4)
    lay = pipelines(2, 2, schedule="gpipe", dp_sync="sharded-ps", dp_compress=codec)
    got = counted(lay)
    model = systems.get("ours").cross_node_bytes_fn({"dp_compress": codec})
    assert model(list(range(4)), cfg, BATCH, lay, MICRO, FP32) == sum(b[0] for b in got.values())
    assert model([0] * 4, cfg, BATCH, lay, MICRO, FP32) == 0
    halves = model([0, 0, 1, 1], cfg, BATCH, lay, MICRO, FP32)  # pipelines inside a node, the exchange across
    assert 0 < halves < sum(b[0] for b in got.values())
