"""The small CNN trained for real (HetPipe's convergence figures): its layer profile is the module's, its
teacher-labelled images have the floor they say, it learns toward that floor, and HetPipe's and Horovod's
runtimes train it as one process would (loopback)."""
from __future__ import annotations

import json
import math

import pytest
import torch

from harness.cli import main
from harness.cli.run_flags import run_request
from harness.plan.layouts import plan_run
from harness.results import read_records
from harness.train import cnn
from harness.train.local import run_local
from harness.train.reference import make_optimizer
from harness.workloads.cnn import small_resnet

pytestmark = pytest.mark.timeout(300)

TESTBED = ["--scenario", "hetpipe-testbed", "--network", "none", "--model", "small-resnet"]


def test_the_layer_profile_is_the_modules():
    """Per unit, the profile's parameters are the module's and its output is the activation a stage sends."""
    net, profile = cnn.SmallResNet(0), small_resnet()
    per_unit = [0] * len(cnn.UNITS)
    for name, p in net.named_parameters():
        per_unit[cnn.unit_of(name)] += p.numel()
    assert [l.name for l in profile.layers] == list(cnn.UNITS)
    assert [l.params for l in profile.layers] == per_unit
    assert [l.out_values for l in profile.layers] == [math.prod(cnn.activation_shape(k, 1)) for k in range(7)]
    x = torch.zeros(2, *cnn.IMAGE)
    assert net.stage(0, 3)(x).shape == cnn.activation_shape(2, 2)
    assert net(x).shape == (2, cnn.CLASSES)


def test_teacher_labels_have_the_floor_they_say():
    """Same (seed, iteration), same batch; the labels' mean surprise under the teacher is its mean entropy,
    the floor, within four standard errors; the floor is well below chance (there is something to learn)."""
    x, y = cnn.teacher_batch(8192, 3, seed=1)
    x2, y2 = cnn.teacher_batch(8192, 3, seed=1)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(cnn.teacher_batch(8192, 4, seed=1)[1], y)
    surprise = -torch.log_softmax(cnn.teacher().logits(x), 1).gather(1, y[:, None]).squeeze(1)
    floor = cnn.teacher_floor(seed=1)
    assert abs(float(surprise.mean()) - floor) < 4 * float(surprise.std()) / math.sqrt(len(surprise))
    assert 0.3 < floor < cnn.chance_loss() - 1.0


def test_the_student_learns_toward_the_floor():
    torch.manual_seed(0)
    net = cnn.SmallResNet(0)
    opt = make_optimizer(net.parameters(), 0.02)
    losses = []
    for it in range(150):
        x, y = cnn.teacher_batch(32, it)
        loss = cnn.classification_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    floor, chance = cnn.teacher_floor(), cnn.chance_loss()
    assert losses[0] > chance - 0.2  # it starts at chance
    assert sum(losses[-30:]) / 30 < floor + 0.35 * (chance - floor)


def reference(batch: int, steps: int, lr: float) -> tuple[list[float], dict]:
    """One process, SGD with momentum on the whole batch: (loss per step, final weights)."""
    net = cnn.SmallResNet(0)
    opt = make_optimizer(net.parameters(), lr)
    losses = []
    for it in range(steps):
        x, y = cnn.teacher_batch(batch, it)
        loss = cnn.classification_loss(net(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach() for k, v in net.named_parameters()}


def assert_state(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-5, atol=1e-6, msg=k)


def test_hetpipe_one_vw_one_in_flight_trains_the_cnn_as_one_process():
    """One VW over the 4 nodes' first GPUs, N_m = 1, D = 0: every minibatch is a wave, pushed to the shards and
    pulled back, the stages cut between the CNN's units; the weights are one process's SGD steps."""
    p = plan_run(run_request(["--system", "hetpipe", *TESTBED, "--devices", "4", "--policy", "0,1,2,3",
                              "--in-flight", "1", "--staleness", "0", "--batch", "4", "--micro-batch", "4",
                              "--iters", "3", "--warmup", "1", "--lr", "0.02"]))
    assert p.spec.layout.pp == 4 and p.spec.layout.layers == len(cnn.UNITS)
    got = run_local(p.spec, collect_state=True)
    losses, state = reference(4, 4, 0.02)
    assert_state(got.state_dict(), state)
    assert [s.loss for s in got.stats] == pytest.approx(losses[1:], rel=1e-5)


def test_horovod_trains_the_cnn_as_one_process():
    """Four ranks, two minibatches of 2 each per iteration and rank: the all-reduced mean gradient is the
    batch's."""
    p = plan_run(run_request(["--system", "horovod", *TESTBED, "--devices", "4", "--batch", "16", "--micro-batch",
                              "2", "--iters", "2", "--warmup", "1", "--lr", "0.02"]))
    got = run_local(p.spec, collect_state=True)
    losses, state = reference(16, 3, 0.02)
    assert_state(got.state_dict(), state)
    assert [s.loss for s in got.stats] == pytest.approx(losses[1:], rel=1e-5)


def test_a_cnn_run_writes_its_records_and_floor(tmp_path, capsys):
    assert main(["run", "--system", "horovod", *TESTBED, "--devices", "4", "--batch", "8", "--micro-batch", "2",
                 "--iters", "2", "--results", str(tmp_path)]) == 0
    (d,) = [p for p in tmp_path.glob("hetpipe-testbed/*") if p.is_dir()]
    manifest = json.loads((d / "manifest.json").read_text())
    assert manifest["status"] == "ok"
    assert manifest["data"] == {"set": "teacher", "loss_floor": pytest.approx(cnn.teacher_floor())}
    assert "small-resnet L=7 batch 8" in capsys.readouterr().err
    records = read_records(d / "records.csv")
    assert [r["model"] for r in records] == ["small-resnet"] * 2
    assert all(math.isfinite(r["loss"]) and r["seq"] == 1 and r["pflop"] > 0 for r in records)


def test_sim_compare_predicts_compute_model_cnn_runs(tmp_path):
    """Paced to the testbed's GPUs (x30000: a CPU rank computes within its modelled time), HetPipe's CNN run is
    what the WSP simulation of its layout over the CNN's layers says, and Horovod's what its loop's model says
    (its share of the batch, one all-reduce, the update): no calibration. (Emulated, dilated as the probe
    chooses, 8 devices, batch 32: hetpipe -12.5 %, horovod -1.1 %.)"""
    from harness.sim.compare import compare, load_measured

    common = [*TESTBED, "--devices", "8", "--batch", "32", "--iters", "2", "--compute-model",
              "--compute-time-scale", "30000", "--results", str(tmp_path)]
    assert main(["run", "--system", "hetpipe", "--policy", "ed", "--ps-placement", "local", "--micro-batch", "8",
                 *common]) == 0
    assert main(["run", "--system", "horovod", "--micro-batch", "4", *common]) == 0
    rows = {c.system: c for c in compare(load_measured(tmp_path))}
    assert set(rows) == {"hetpipe", "horovod"}
    for c in rows.values():
        assert abs(c.error) < 0.25, (c.system, c.measured_s, c.simulated_s)


@pytest.mark.parametrize("flags,message", [
    (["--system", "megatron"], "--model small-resnet: megatron trains GPTs only (a CNN: "),
    (["--system", "horovod", "--data", "markov"], "model.data: must be one of teacher (got 'markov')"),
    (["--system", "hetpipe", "--layers", "3"], "model.layers: small-resnet is a CNN of fixed depth"),
    (["--system", "horovod", "--checkpoint-every", "1"], "a CNN's run writes no checkpoints"),
    (["--system", "hetpipe", "--model", "resnet9"], "--model: unknown model 'resnet9' (known: tiny,"),
])
def test_bad_input_is_one_line(tmp_path, capsys, flags, message):
    assert main(["run", *TESTBED, "--devices", "4", "--results", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not any(tmp_path.rglob("manifest.json"))


def test_hetpipe_records_its_first_stages_gates(tmp_path):
    """ED on 8 devices (2 VWs), N_m = 2, D = 0, 4 iterations of 2 minibatches per VW: every gated minibatch (the
    last of waves 1 to 3) says when its pull completed after the wave two before ended, and how long the first
    stage was blocked in it, no longer than that."""
    from harness.results import read_minibatches
    from harness.systems.hetpipe import wsp

    assert main(["run", "--system", "hetpipe", *TESTBED, "--devices", "8", "--batch", "32", "--micro-batch", "8",
                 "--in-flight", "2", "--iters", "4", "--warmup", "0", "--lr", "0.005",
                 "--results", str(tmp_path)]) == 0
    (d,) = [p for p in tmp_path.glob("hetpipe-testbed/*") if p.is_dir()]
    rows = read_minibatches(d / "minibatches.csv")
    assert sorted(r["minibatch"] for r in rows if not math.isnan(r["pulled"])) == [3, 3, 5, 5, 7, 7]
    assert sorted(r["minibatch"] for r in rows if not math.isnan(r["wave_done"])) == [1, 1, 3, 3, 5, 5, 7, 7]
    waiting, idle = wsp.recorded_gate_waits(rows, 2)
    assert len(waiting) == 6 and (waiting > 0).all() and (idle >= 0).all() and (idle <= waiting).all()
