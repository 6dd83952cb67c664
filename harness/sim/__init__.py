"""Iteration simulator: predicts one training iteration of every system at any scale, from first principles
(FLOPs, bytes and seconds of the work: harness/compute/).

network.py   links (delay + bytes/rate, max-min fair sharing) and collectives as point-to-point steps
pipeline.py  event timeline of GPipe / 1F1B stages, overlapped or blocking point-to-point
systems.py   ours, ours-random, Megatron (TP x PP x DP), DeepSpeed (ZeRO-3, ZeRO-1 + PP)
sweep.py     every layout and placement of a scenario, the best of each system, records (backend=sim)
torch_runtime.py  the baselines as the harness runs them (torch pipelining + DDP/ZeRO-1 over gloo), for compare
compare.py   simulated vs measured iteration times from records of the shared schema; calibration
"""
