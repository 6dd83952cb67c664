"""Megatron-style and DeepSpeed-style baselines, built from PyTorch's own implementations: the runtime and
the simulator models the megatron and deepspeed systems share (their packages hold their entries).

- parallelize.py: apply_tp / apply_ddp / apply_fsdp / zero1_optimizer / pipeline stage + schedule.
- train.py: one rank of a run (device mesh, model part, pipeline schedule, optimizer, timing).
- systems.py: the rank functions of `megatron` and `deepspeed` (their entries: ../megatron, ../deepspeed).
- sim.py: Megatron-LM's and DeepSpeed's iterations in the simulator, the model `sim compare` holds a
  baseline run against, and the layouts of legacy records.
- tune.py: `harness tune`, the grid search of appendix D.2.

gloo/CPU pitfalls met on torch 2.13 and how they are handled (tests in tests/test_baselines_*.py):
- DDP under a pipeline schedule: the reducer's bucket rebuild after the first iteration trips an
  internal assert when several micro-batch backwards ran; DDP is built with find_unused_parameters.
- DDP cannot take DTensor (tensor-parallel) parameters and PyTorch's TP+DDP bridge loses the
  Parameters under a pipeline; tensor-parallel parts use `replicate` (DDP on FSDP2) instead.
- A process group numbers members by global rank and DTensor shards follow that numbering, not the
  mesh coordinate: rank orders are normalised so each TP group ascends (membership unchanged).
- new_group's sorted numbering also breaks pipelining's stage -> peer map under permuted layouts;
  the map is set from the layout.
- A dead or silent peer ends in gloo's timeout (RunSpec.timeout_s) and a one-line error, never a hang.
"""
