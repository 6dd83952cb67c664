"""The learnable synthetic data set: a fixed random Markov chain whose loss floor (its entropy rate) is known.

Checked against samples, not assumed: the entropy rate is the mean -log P(next | current) of drawn
sequences, sequences start in the stationary distribution, a small GPT trained on the chain approaches the
floor (and not below it) where on uniform tokens it stays at log V, and every system trains on the same
batches (ours matches the single-process reference on the chain too).
"""
from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from harness import layout as layouts
from harness.cli import main
from harness.compute.model import get_model
from harness.train.gpt import loss_floor, synthetic_batch
from harness.train.local import local_spec, run_local
from harness.train.reference import reference_train
from harness.workloads.markov import markov_chain

pytestmark = pytest.mark.timeout(180)


def _dense(chain) -> np.ndarray:
    p = np.zeros((chain.vocab, chain.vocab))
    np.put_along_axis(p, chain.successors, chain.probs, axis=1)
    return p


def test_the_entropy_rate_is_the_mean_loss_of_the_true_model_on_samples():
    chain = markov_chain(64, seed=5)
    x = chain.sample(4000, 100, torch.Generator().manual_seed(1)).numpy()
    p = _dense(chain)
    nll = -np.log(p[x[:, :-1], x[:, 1:]])
    assert np.isfinite(nll).all()  # every drawn step is an edge of the chain
    assert nll.mean() == pytest.approx(chain.entropy_rate, abs=0.01)
    assert chain.entropy_rate < math.log(64) - 2  # far below uniform: there is something to learn


def test_sequences_start_in_the_stationary_distribution():
    chain = markov_chain(32, seed=2)
    p = _dense(chain)
    assert p.sum(axis=1) == pytest.approx(np.ones(32))
    assert chain.stationary @ p == pytest.approx(chain.stationary, abs=1e-12)
    first = chain.sample(20000, 1, torch.Generator().manual_seed(0)).numpy()[:, 0]
    assert np.abs(np.bincount(first, minlength=32) / 20000 - chain.stationary).max() < 0.01


def test_the_chain_is_fixed_by_vocab_and_seed():
    a, b, c = markov_chain(128, 0), markov_chain(128, 0), markov_chain(128, 1)
    assert a is b  # cached; the same arrays on every rank of a run
    rebuilt = markov_chain.__wrapped__(128, 0)
    assert (rebuilt.successors == a.successors).all() and (rebuilt.probs == a.probs).all()
    assert not (c.successors == a.successors).all()
    cfg = get_model("tiny", 1)
    t1, _ = synthetic_batch(cfg, 4, 7, 0, "markov")
    t2, _ = synthetic_batch(cfg, 4, 7, 0, "markov")
    assert torch.equal(t1, t2) and not torch.equal(t1, synthetic_batch(cfg, 4, 8, 0, "markov")[0])


def test_a_small_gpt_approaches_the_floor_on_the_chain_and_learns_nothing_from_uniform_tokens():
    cfg = replace(get_model("tiny", 1), vocab=64, seq=32)
    floor = loss_floor(cfg, "markov", 3)
    markov, _ = reference_train(cfg, 16, 16, 150, seed=3, lr=0.1, data="markov")
    uniform, _ = reference_train(cfg, 16, 16, 150, seed=3, lr=0.1, data="uniform")
    # each step's loss is measured on fresh batches before the update: in expectation never below the floor
    end_markov, end_uniform = np.mean(markov[-30:]), np.mean(uniform[-30:])
    assert floor - 0.05 < end_markov < floor + 0.35, (end_markov, floor)
    assert end_uniform == pytest.approx(math.log(64), abs=0.05)
    assert loss_floor(cfg, "uniform") == math.log(64)


def test_ours_matches_the_reference_on_the_chain():
    cfg = get_model("tiny", 4)
    ref, _ = reference_train(cfg, 8, 2, 3, seed=3, lr=0.1, data="markov")
    uni, _ = reference_train(cfg, 8, 2, 3, seed=3, lr=0.1, data="uniform")
    lay = layouts.from_pipelines([[0, 1], [2, 3]], 4, "identity", schedule="1f1b", dp_sync="sharded-ps")
    run = run_local(local_spec(lay, name="tiny", batch=8, micro_batch=2, iters=3, seed=3, lr=0.1, data="markov",
                               timeout_s=60), timeout_s=90)
    assert [s.loss for s in run.stats] == pytest.approx(ref, rel=1e-5)
    assert ref != pytest.approx(uni, rel=1e-3)  # the data set really changed what was trained on


def test_harness_run_records_the_data_set_and_its_floor(tmp_path, capsys):
    args = ["run", "--scenario", "3", "--devices", "2", "--network", "none", "--model", "tiny", "--layers", "2",
            "--batch", "4", "--micro-batch", "2", "--iters", "1", "--warmup", "0", "--system", "megatron",
            "--pp", "2", "--dp", "1", "--data", "markov", "--seed", "4", "--results", str(tmp_path)]
    assert main(args) == 0
    out, err = capsys.readouterr()
    m = json.loads((next(tmp_path.rglob("manifest.json"))).read_text())
    floor = markov_chain(1024, 4).entropy_rate
    assert m["spec"]["model"]["data"] == "markov"
    assert m["data"] == {"set": "markov", "loss_floor": pytest.approx(floor)}
    assert f"(floor {floor:.4g} on markov data)" in err


def test_an_unknown_data_set_is_one_line(capsys):
    assert main(["run", "--scenario", "5", "--network", "none", "--data", "zipf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) <= 2 and "--data" in err[0] and "zipf" in err[0]
