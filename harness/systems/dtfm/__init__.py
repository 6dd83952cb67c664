"""`dtfm` and `dtfm-random`: the paper's own runtime (DS3Lab/DT-FM) in the simulator, on the scheduler's
assignment and on the seeded random ones. They stand for the paper's system in `harness sim report`
(`report_role`); `ours` is this harness's runtime and keeps its own column. Simulator only: sim.py."""
from __future__ import annotations

from ...plan.systems import System, register

register(System(
    "dtfm", "the paper's own runtime (DS3Lab/DT-FM: barriers, GPipe, sharded PS after the backward), simulated",
    simulate={"gpt": "harness.systems.dtfm.sim:candidates_dtfm"},
    simulate_layout="harness.systems.dtfm.sim:simulate_dtfm_layout", scheduled=True, report_role="ours",
    sources="harness.systems.dtfm.sim:CONFIG_SOURCES", stage_memory="harness.systems.dtfm.memory:stage_memory",
    style=("#17becf", "*"),
))
register(System(
    "dtfm-random", "the paper's own runtime on the seeded random assignment (its ablation), simulated",
    simulate={"gpt": "harness.systems.dtfm.sim:candidates_dtfm_random"},
    simulate_layout="harness.systems.dtfm.sim:simulate_dtfm_layout", report_role="ours-random",
    sources="harness.systems.dtfm.sim:CONFIG_SOURCES", stage_memory="harness.systems.dtfm.memory:stage_memory",
    style=("#9edae5", "X"),
))
