"""`deepspeed`: ZeRO-3 over every device, or ZeRO-1 + pipeline. Rank function: harness/systems/baselines/
(torch's FSDP2, ZeroRedundancyOptimizer, pipelining), shared with megatron; simulator models:
harness/systems/baselines/sim.py (DeepSpeed's design), its candidates: sim.py."""
from __future__ import annotations

from ...layout import Layout, LayoutError
from ...plan.layouts import baseline_mesh, check_product
from ...plan.request import RunRequest
from ...plan.systems import BASELINE_FLAGS, System, register
from ...scenario import Topology


def deepspeed_layout(req: RunRequest, topo: Topology) -> tuple[Layout, None]:
    """DeepSpeed's layout rule: ZeRO-3 over all devices, or ZeRO-1 + pipeline (missing degree filled)."""
    want, n = req.layout, topo.n
    check_product(want, n)
    if want.zero not in (1, 3):
        raise LayoutError(f"--zero: must be 1 or 3 for --system deepspeed (got {want.zero!r})")
    if want.zero == 3:
        if want.pp not in (None, 1):
            raise LayoutError(f"--pp: ZeRO-3 runs without pipeline (got {want.pp})")
        pp, dp = 1, n
    else:
        pp = want.pp or (n // want.dp if want.dp else n)
        dp = want.dp or n // pp
    return baseline_mesh(want, req.model, 1, pp, dp, want.zero, n), None


register(System(
    "deepspeed", "ZeRO-3 over every device, or ZeRO-1 + pipeline (--zero, --pp/--dp)",
    train="harness.systems.baselines.systems:train_deepspeed", checkpoints=True, fault_phases=("checkpoint",), layout_rule=deepspeed_layout,
    simulate_layout="harness.systems.baselines.sim:simulate_runtime_of_layout",
    stage_memory="harness.systems.deepspeed.zero3:stage_memory",
    flags=BASELINE_FLAGS[1:] + ("--zero",), defaults={"schedule": "1f1b"},
    simulate={"gpt": "harness.systems.deepspeed.sim:candidates_deepspeed"}, record_layout="harness.systems.baselines.sim:legacy_zero3_layout",
    tune_grid="harness.layout:deepspeed_grid", paper_role="deepspeed", sources="harness.systems.baselines.sources:DEEPSPEED", style=("#2ca02c", "v"),
    gate_runs={"wire": {"layout": {"pp": 2, "dp": 4, "zero": 1}}},
))
