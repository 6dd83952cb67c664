"""`ours` and `ours-random`: the paper's scheduled pipeline x data parallel, and the same runtime on the
seeded random assignment (the paper's ablation). Rank function: pipeline.py (with dp_sync.py); layout
rules: layout.py; simulator model, its candidates and its legacy records: sim.py."""
from __future__ import annotations

from ...plan.arg_types import codec_text
from ...plan.request import FAULT_PHASES
from ...plan.systems import Option, System, register
from .layout import RANDOM_ASSIGNMENT, place_ours, place_ours_random

FLAGS = ("--d-pp", "--d-dp", "--scheduler", "--budget", "--schedule", "--dp-sync", "--recompute", "--allocator", "--replan")

# the data-parallel exchange's codec (compute/compression.py); the layout rule puts it in the layout
OPTIONS = (Option("dp_compress", codec_text, "the data-parallel exchange's codec: none, cocktail (CocktailSGD: random "
                  "subset, top-k, n-bit buckets, error feedback; settings randomp_ratio, topk_ratio, quant_bits, "
                  "quant_bucket_size, error_feedback: cocktail:topk_ratio=0.1,quant_bits=4), int8, fp8", "none"),)

register(System(
    "ours", "the paper's scheduled pipeline x data parallel (--d-pp/--d-dp, --scheduler)",
    train="harness.systems.ours.pipeline:train_ours", layout_rule=place_ours, flags=FLAGS,
    defaults={"scheduler": "ga", "schedule": "gpipe"}, simulate={"gpt": "harness.systems.ours.sim:candidates_ours"},
    simulate_layout="harness.systems.ours.sim:simulate_ours_layout", record_layout="harness.systems.ours.sim:legacy_ours_layout",
    cross_node_bytes="harness.systems.ours.sim:ours_cross_node_bytes",
    options=OPTIONS, compute_observed=True, scheduled=True, paper_role="ours", style=("#d62728", "o"),
    recovery="replan",
    checkpoints=True, fault_phases=FAULT_PHASES,
    gate_runs={"wire": {}, "measured": {}},
))
register(System(
    "ours-random", "ours' runtime on the seeded random assignment (the paper's ablation; --seed)",
    train="harness.systems.ours.pipeline:train_ours", layout_rule=place_ours_random,
    flags=tuple(f for f in FLAGS if f not in ("--scheduler", "--budget", "--replan")),
    defaults={"scheduler": RANDOM_ASSIGNMENT, "schedule": "gpipe"},
    simulate={"gpt": "harness.systems.ours.sim:candidates_ours_random"},
    simulate_layout="harness.systems.ours.sim:simulate_ours_layout", record_layout="harness.systems.ours.sim:legacy_random_layout",
    cross_node_bytes="harness.systems.ours.sim:ours_cross_node_bytes",
    options=OPTIONS, compute_observed=True, paper_role="ours-random", style=("#ff9896", "s"), checkpoints=True,
    fault_phases=FAULT_PHASES,
    gate_runs={"measured": {"model": {"seed": 2022}}},
))
