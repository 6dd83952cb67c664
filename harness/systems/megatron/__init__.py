"""`megatron`: tensor x pipeline x data parallel in Megatron-LM's rank order. Rank function:
harness/systems/baselines/ (torch's DTensor TP, pipelining, DDP), shared with deepspeed; simulator model:
harness/systems/baselines/sim.py (Megatron-LM's design), its candidates: sim.py."""
from __future__ import annotations

from ...layout import Layout
from ...plan.layouts import baseline_mesh, check_product
from ...plan.request import RunRequest
from ...plan.systems import BASELINE_FLAGS, System, register
from ...scenario import Topology


def megatron_layout(req: RunRequest, topo: Topology) -> tuple[Layout, None]:
    """Megatron's layout rule: tp x pp x dp, missing degrees filled (dp, then pp)."""
    want, n = req.layout, topo.n
    check_product(want, n)
    tp = want.tp or 1
    pp = want.pp or (n // (tp * want.dp) if want.dp else 1)
    dp = want.dp or n // (tp * pp)
    return baseline_mesh(want, req.model, tp, pp, dp, 0, n), None


register(System(
    "megatron", "tensor x pipeline x data parallel in Megatron-LM's rank order (--tp/--pp/--dp)",
    train="harness.systems.baselines.systems:train_megatron", checkpoints=True, fault_phases=("checkpoint",), layout_rule=megatron_layout,
    simulate_layout="harness.systems.baselines.sim:simulate_runtime_of_layout",
    flags=BASELINE_FLAGS, defaults={"schedule": "1f1b"}, simulate={"gpt": "harness.systems.megatron.sim:candidates_megatron"},
    tune_grid="harness.layout:megatron_grid", paper_role="megatron", sources="harness.systems.baselines.sources:MEGATRON", style=("#1f77b4", "^"),
    # measured: its rank-order layout without tensor parallelism (TP all-reduces across continents would take
    # minutes an iteration); 11 s an iteration here, so one warm-up and two timed iterations
    gate_runs={"wire": {"layout": {"tp": 2, "pp": 2, "dp": 2}},
               "measured": {"layout": {"tp": 1, "pp": 4, "dp": 2}, "run": {"warmup": 1, "iters": 2}}},
))
