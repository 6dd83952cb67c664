"""OWL's round for real, on loopback (no shaping, no user-mode Linux): the processes deliver the server's model to
every worker, relays inside racks are real, bytes are counted as sent, and a process that dies fails the round
naming it. The same launcher runs in the emulated cluster (tests/test_owl_emulated.py)."""
from __future__ import annotations

import time

import pytest
import torch

from harness.systems.owl.emulated import EmuSetting, fl_spec, plan_rounds
from harness.systems.owl.launcher import launch
from harness.train.launch import RankFailure
from harness.workloads.fl.flows import layer_bytes, traffic
from harness.workloads.fl.federation import load_federation
from harness.workloads.fl.models import BYTES_PER_PARAM, get_branchy
from harness.workloads.fl.nets import BranchyNet, forward_by_units

pytestmark = pytest.mark.timeout(180)


def _spec(strategies, **kw):
    model = get_branchy("tiny")
    fed = load_federation("owl-testbed", 4).scaled(1e-3, 100.0)  # compute held to ~1 ms a layer
    rounds = plan_rounds(model, fed, strategies, 4)
    return model, fed, rounds, fl_spec(model, fed, rounds, 4, EmuSetting(1e-3, 100.0, timeout_s=90, **kw))


def test_units_compute_the_profiles_layers_with_their_parameters():
    for name in ("tiny", "mini-inception"):
        model = get_branchy(name)
        net = BranchyNet(model).eval()
        units = [u for base in net.bases for branch in base for u in branch]
        assert [sum(p.numel() for p in u.parameters()) * BYTES_PER_PARAM for u in units] == list(layer_bytes(model))
        x = torch.randn(2, 3, 32, 32)
        assert torch.allclose(forward_by_units(net.bases, net.joins, x), net(x))
        assert net(x).shape == (2, 10)


def test_every_worker_gets_the_servers_model_and_owl_relays_inside_racks():
    model, fed, rounds, spec = _spec(["naive", "owl"])
    t0 = time.time()
    out = launch(spec, [{"addr": "127.0.0.1"} for _ in range(fed.workers + 1)], port=29611)
    t1 = time.time()
    # every rank says when its round began on the wall clock (the host's CPU monitor's window: the headroom)
    # and how late its paced phases woke
    for ranks in out:
        assert all(t0 < r.wall_start < t1 and r.late_s >= 0 for r in ranks)
    assert out[0][0].wall_start < out[1][0].wall_start
    S = model.params * BYTES_PER_PARAM
    (naive, owl) = out
    # every worker checked what it received against the server's model bit for bit (or the round failed);
    # every layer arrived, the forward ran after the last one it needed, the round after the forward
    for ranks in out:
        for w in ranks[:-1]:
            assert len(w.arrivals) == len(model.layers) and 0 < max(w.arrivals) <= w.forward_end < w.end
    # counted as sent: naive, one model per worker out of the server and nothing between workers
    assert naive[-1].sent == {"server": fed.workers * S}
    assert all(set(w.sent) == {"allreduce"} for w in naive[:-1])
    # owl: one model per rack out of the server; the rest relayed inside the racks, exactly what the plan says
    planned_server, planned_racks, planned_inter = traffic(fed, rounds[1].transfers)
    assert owl[-1].sent["server"] == planned_server == len(fed.racks) * S
    counted_racks = [sum(w.sent.get(f"rack{r}", 0) for w in owl[:-1]) for r in range(len(fed.racks))]
    assert counted_racks == list(planned_racks) and sum(counted_racks) == (fed.workers - len(fed.racks)) * S
    assert not any("inter" in w.sent for w in owl[:-1]) and planned_inter == 0
    # the gradient all-reduce: every worker 2 (W - 1) / W of the model (ring), the same under every strategy
    for ranks in out:
        assert [w.sent["allreduce"] for w in ranks[:-1]] == [round(2 * (fed.workers - 1) / fed.workers * S)] * 4


@pytest.mark.parametrize("who, name", [(1, "worker 1 (rack 0"), (4, "server (device 4")])
def test_a_process_that_dies_mid_round_fails_it_naming_the_process(who, name):
    _, fed, _, spec = _spec(["naive"], fault_rank=who)
    t0 = time.monotonic()
    with pytest.raises(RankFailure, match=r"killed by signal SIGKILL") as e:
        launch(spec, [{"addr": "127.0.0.1"} for _ in range(fed.workers + 1)], port=29621 + who)
    assert str(e.value).startswith(name)
    assert time.monotonic() - t0 < 60  # the others are stopped within fork_ranks' grace, not the run's timeout


def test_the_receivers_check_catches_a_parameter_that_differs_from_the_servers():
    from harness.systems.owl.runtime import _Model, check_received

    received, server = _Model("tiny", 0), _Model("tiny", 0)
    check_received(received, server, 3)  # the same seed: the same model
    with torch.no_grad():
        received.params[5][0].view(-1)[0] += 1e-6
    with pytest.raises(RuntimeError, match="worker 3: layer 5: the parameters received differ"):
        check_received(received, server, 3)
