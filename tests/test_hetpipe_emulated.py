"""HetPipe and Horovod in the emulated cluster (one boot, `--each`): the parameter server's traffic crosses the
shaped links, Wave Synchronous Parallel's bounds hold in the records, Horovod trains beside it, a GPT and a CNN."""
from __future__ import annotations

import json

import pytest

from harness.cli import main
from harness.results import read_minibatches, read_records
from harness.systems.hetpipe import wsp
from harness.workloads.gpt_layers import gpt_layer_profile
from harness.compute.model import get_model
from tests import emulation

pytestmark = emulation.marks()

SCALE = 0.002  # the testbed's 56 Gbps between nodes -> 112 Mbps


def _label(run) -> tuple:
    """(label, run directory): a tiny GPT's run by its system, the CNN's by its model."""
    spec = json.loads((run / "manifest.json").read_text())["spec"]
    return spec["run"]["system"] if spec["model"]["name"] == "tiny" else spec["model"]["name"], run


def test_shards_traffic_crosses_the_shaped_links_and_wsp_holds(tmp_path, capsys):
    """Two VWs over the testbed's 4 nodes (one GPU each), N_m = 1, D = 0: every minibatch is a wave whose update
    goes to the shards and whose successor waits for the pull. Round-robin placement puts the shards of
    blocks 0 and 1 on the first two nodes, which the second VW reaches only over the nodes' shaped links: each of
    its minibatches moves its stages' blocks there and back, so an iteration cannot beat that at 112 Mbps."""
    rc = main(["run", "--scenario", "hetpipe-testbed", "--devices", "4", "--network", "emulated", "--model", "tiny",
               "--batch", "4", "--iters", "2", "--warmup", "1", "--bandwidth-scale", str(SCALE),
               "--results", str(tmp_path),
               "--each", "--system hetpipe --layers 2 --policy '0,1;2,3' --in-flight 1 --staleness 0",
               "--each", "--system horovod --layers 2",
               "--each", "--system horovod --model small-resnet"])
    assert rc == 0, capsys.readouterr().err
    runs = dict(_label(d) for d in tmp_path.glob("hetpipe-testbed/*") if d.is_dir())
    hp = runs["hetpipe"]
    man = json.loads((hp / "manifest.json").read_text())
    assert man["status"] == "ok" and sorted(map(sorted, man["placement"]["vws"])) == [[0, 1], [2, 3]]
    assert man["spec"]["layout"]["wsp"]["ps_hosts"] == [0, 1]
    rows = [wsp.MinibatchRecord.of_row(r) for r in read_minibatches(hp / "minibatches.csv")]
    assert len(rows) == 2 * 2 * 3 and wsp.check_bounds(rows, 1, 0) == []
    assert max(r.global_version for r in rows) >= 4  # every minibatch pulled what every VW pushed
    # the second VW's stages hold block 0 (and the embeddings) and block 1 (and the head), fp32, whose shards
    # are on the other two nodes: the smaller of the two is a lower bound of a push, and of a pull
    stage_bytes = min(layer.params * 4 for layer in gpt_layer_profile(get_model("tiny", 2)).layers)
    per_transfer = stage_bytes / (56e9 * SCALE / 8)
    for r in read_records(hp / "records.csv"):  # 2 minibatches per VW an iteration, a push then a pull each
        # (0.75: the shaper's burst lets a little through above the rate; on loopback this takes milliseconds)
        assert r["backend"] == "emu" and r["seconds"] > 0.75 * 2 * 2 * per_transfer, (r["seconds"], per_transfer)
    # what each device's interface sent to whom, as its kernel counted it (network/egress.py): each stage of VW 1
    # pushes its block's update to that block's shard and gets the weights back, one wave a minibatch, 2 a timed
    # iteration; to the other shard it sends only the names its pull waits on. A rank counts over its own timed
    # iterations: the shard's host, in VW 0, may still be in its warm-up iteration (2 waves) when VW 1's first
    # timed pulls are answered
    sent = man["egress"]["bytes"]
    waves = 2 * man["egress"]["iterations"]
    vw1 = [stage[1][0] for stage in man["spec"]["layout"]["mesh"]]  # its device of each stage (= block)
    assert sorted(vw1) == [2, 3]
    for block, (device, host) in enumerate(zip(vw1, (0, 1))):
        assert sent[device][host] >= waves * stage_bytes and sent[host][device] >= (waves - 2) * stage_bytes, (
            sent, block)
        assert sent[device][1 - host] < stage_bytes, (sent, block)
    recs = read_records(runs["horovod"] / "records.csv")
    assert [r["d_dp"] for r in recs] == [4, 4] and all(0 < r["loss"] < 10 for r in recs)
    # Horovod's all-reduce: any algorithm sends 2 (n - 1) / n of the gradients from each of the n ranks, in all
    egress = json.loads((runs["horovod"] / "manifest.json").read_text())["egress"]
    grads = sum(layer.params for layer in gpt_layer_profile(get_model("tiny", 2)).layers) * 4
    assert sum(map(sum, egress["bytes"])) >= egress["iterations"] * 2 * 3 * grads, (egress, grads)
    # the small CNN trains through the emulated cluster too, and the simulator predicts its run
    from harness.sim.compare import compare, load_measured

    recs = read_records(runs["small-resnet"] / "records.csv")
    assert [r["model"] for r in recs] == ["small-resnet"] * 2 and all(0 < r["loss"] < 10 for r in recs)
    assert compare(load_measured(runs["small-resnet"]))[0].simulated_s > 0
