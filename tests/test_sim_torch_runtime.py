"""The torch-pipelining runtime model (what the emulated baselines run): closed forms and schedule order."""
from __future__ import annotations

import numpy as np
import pytest

from harness import layout as layouts
from harness.compute.model import GPTConfig, even_split, get_model, stage_params
from harness.compute.profiles import device_profiles
from harness import compute
from harness.netmodel import collectives
from harness.sim import pipeline
from harness.sim import torch_runtime
from harness.netmodel.links import Links
from tests.conftest import make_topology

TINY = get_model("tiny", 4)


def uniform(n, delay_ms, gbps):
    return make_topology(np.full((n, n), delay_ms), np.full((n, n), gbps))


# torch's Schedule1F1B refuses fewer micro-batches than stages, GPipe does not
@pytest.mark.parametrize("schedule,P,M", [("1f1b", 2, 2), ("1f1b", 4, 4), ("1f1b", 4, 9), ("gpipe", 2, 2),
                                          ("gpipe", 4, 9), ("gpipe", 3, 1)])
def test_program_runs_the_schedules_compute_order_and_posts_every_message_once(schedule, P, M):
    for j in range(P):
        prog = torch_runtime.schedule_program(schedule, P, M, j)
        compute = [(op[0], op[1]) for op in prog if op[0] in ("F", "B")]
        # torch's ScheduleGPipe runs its backwards in forward order (ours reverses them); 1F1B is the same
        expected = ([("F", m) for m in range(M)] + [("B", m) for m in range(M)] if schedule == "gpipe"
                    else pipeline.task_order(schedule, P, M, j))
        assert compute == expected
        posted = [msg for op in prog if op[0] == "post" for msg in op[1]]
        waited = [msg for op in prog if op[0] == "wait" for msg in op[1]]
        assert len(posted) == len(set(posted)) and sorted(posted) == sorted(set(waited))
        n_act = (j > 0) + (j < P - 1)
        assert len(posted) == 2 * M * n_act  # each neighbour: M messages each way
        assert [op for op in prog if op[0] == "reduce"] == [("reduce",)]


def test_gpipe_two_stages_one_micro_batch_closed_form():
    """Rendezvous: data leaves one delay after the receive is posted."""
    d, gbps = 0.050, 0.01
    topo = uniform(2, d * 1e3, gbps)
    links = Links.from_topology(topo, "gloo", "per-pair")
    prof = device_profiles(topo)
    s = compute.activation_bytes(TINY, 1, 4) / (gbps * 1e9 / 8)
    fwd, bwd = compute.stage_compute(TINY, even_split(TINY.layers, 2), 1, prof, np.array([0, 1]),
                                      recompute=False)
    f0, f1, b0, b1 = fwd[0], fwd[1], bwd[0], bwd[1]
    two_stages = layouts.in_rank_order(1, 2, 1, TINY.layers, schedule="gpipe")
    seconds, _, _ = torch_runtime.simulate(links, prof, TINY, 1, two_stages, bytes_per_value=4)
    # stage 1 posts its receive at 0; its notice reaches stage 0 at d; the activation leaves at
    # max(f0, d) and arrives s + d later; stage 1 computes and posts the gradient; stage 0, done
    # waiting for its send, posts that receive at max(f0, d) + s, whose notice reaches stage 1 d later
    act_sent = max(f0, d) + s
    grad_post = act_sent + d + f1 + b1
    grad_arrive = max(grad_post, act_sent + d) + s + d
    # then each stage's optimizer step (stage 1's once its gradient has left)
    opt = [compute.optimizer_seconds(n, prof[0]) for n in stage_params(TINY, even_split(TINY.layers, 2))]
    assert seconds == pytest.approx(max(grad_arrive + b0 + opt[0], grad_arrive - d + opt[1]), rel=1e-9)
    # with NCCL's model (no ready notice) the same run is faster by the notices on the critical path
    fast, _, _ = torch_runtime.simulate(Links.from_topology(topo, "nccl"), prof, TINY, 1, two_stages,
                                        bytes_per_value=4)
    assert fast < seconds


def test_zero1_broadcasts_closed_form():
    """One worker thread, two members: each broadcast costs a notice, the bytes and a delay."""
    d, gbps = 0.030, 0.1
    links = Links.from_topology(uniform(2, d * 1e3, gbps), "gloo", "per-pair")
    tensors = [4e3, 1e4, 2.5e3]
    end = torch_runtime.broadcasts(links, np.array([0, 1]), np.zeros(2), tensors, [0, 0, 0], threads=1)
    rate = gbps * 1e9 / 8
    assert end[1] == pytest.approx(2 * d * len(tensors) + sum(tensors) / rate)
    # two workers overlap two broadcasts: never slower
    two = torch_runtime.broadcasts(links, np.array([0, 1]), np.zeros(2), tensors, [0, 0, 0], threads=2)
    assert two.max() < end.max()


def test_zero1_partition_is_balanced_and_complete():
    tensors = torch_runtime.stage_tensor_bytes(TINY, even_split(TINY.layers, 4), 4)
    assert [sum(t) / 4 for t in tensors] == [float(x) for x in stage_params(TINY, 4)]
    owner = torch_runtime.zero1_owner(tensors[0], 2)
    loads = [sum(b for b, o in zip(tensors[0], owner) if o == r) for r in range(2)]
    assert set(owner) == {0, 1} and max(loads) - min(loads) <= max(tensors[0])


def test_ddp_reduce_inside_the_last_backward_serialises_the_stages():
    """Stages next to each other on fast links, replicas far apart: the iteration pays every stage's
    all-reduce one after another (DDP reduces before the stage sends its last gradient back)."""
    P, R, d = 4, 2, 0.040
    n = P * R
    dev = np.arange(n).reshape(P, R)
    delay = np.zeros((n, n))
    bw = np.full((n, n), 1000.0)
    for a in range(n):
        for b in range(n):
            if a % R != b % R:  # different replicas
                delay[a, b], bw[a, b] = d * 1e3, 0.1
    topo = make_topology(delay, bw)
    links = Links.from_topology(topo, "gloo", "per-pair")
    cfg = GPTConfig("t", layers=4, hidden=64, heads=4, seq=32, vocab=256)
    prof = device_profiles(topo)
    lay = layouts.with_rank_order(layouts.in_rank_order(1, P, R, cfg.layers), dev.ravel())
    seconds, _, det = torch_runtime.simulate(links, prof, cfg, 8, lay, bytes_per_value=4)
    grads = compute.stage_param_bytes(cfg, lay.layers_per_stage, 4)
    per_stage = [float(collectives.ring_allreduce(links, dev[j][None, :], grads[j]).max()) for j in range(P)]
    assert seconds >= sum(per_stage)
    assert det["pipeline_seconds"] < seconds <= det["pipeline_seconds"] + det["optimizer_seconds"]  # then the step
