import pytest
import torch

from harness.compute.model import ModelError, get_model, stage_layers, stage_params
from harness.compute import c_dp_bytes, c_pp_bytes, pflop_per_iteration
from harness.train.gpt import GPT


def test_pflop_formula_matches_the_papers_table_value():
    # Reference from the paper's tables (DESIGN.md): GPT3-XL, l=24, B=1024, s=2048, h=2048 -> 23.64 PFLOP.
    assert pflop_per_iteration(get_model("gpt3-xl"), 1024) == pytest.approx(23.64, abs=0.005)
    assert pflop_per_iteration(get_model("gpt3-xl", layers=48), 2048) == pytest.approx(4 * 23.644, rel=1e-3)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_parameter_count_matches_the_real_model(name):
    cfg = get_model(name)
    assert sum(p.numel() for p in GPT(cfg).parameters()) == cfg.params


def test_stage_split_and_sizes_follow_the_layout():
    cfg = get_model("gpt3-xl")
    assert stage_layers(cfg, 8) == [3] * 8 and stage_layers(get_model("gpt3-xl", 40), 8) == [5] * 8
    assert stage_layers(get_model("tiny", 10), 4) == [3, 3, 2, 2]
    assert sum(stage_params(cfg, 8)) == cfg.params
    assert c_dp_bytes(cfg, 8) == max(stage_params(cfg, 8)) * 2
    assert c_pp_bytes(cfg, 1024, 8) == 128 * 2048 * 2048 * 2
    assert c_pp_bytes(cfg, 2048, 8) == 2 * c_pp_bytes(cfg, 1024, 8)
    assert c_dp_bytes(cfg, 8, bytes_per_value=4) == 2 * c_dp_bytes(cfg, 8)


def test_bad_model_requests():
    with pytest.raises(ModelError, match="unknown model 'gpt5'"):
        get_model("gpt5")
    with pytest.raises(ModelError, match="--layers"):
        get_model("tiny", layers=0)
    with pytest.raises(ModelError, match="cannot split"):
        stage_layers(get_model("tiny"), 9)
