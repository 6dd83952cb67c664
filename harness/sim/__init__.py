"""Iteration simulator: predicts one training iteration of every system at any scale, from first principles
(FLOPs, bytes and seconds of the work: harness/compute/).

What every system's model shares is here; the models are with their systems (harness/systems/<name>/sim.py,
the baselines' in harness/systems/baselines/sim.py). The links and collectives: harness/netmodel/links.py.

pipeline.py  event timeline of GPipe / 1F1B stages, overlapped or blocking point-to-point
systems.py   a model's result and error, the layer check, every device's optimizer step
cnn.py       the CNN workload's options, candidates and records (HetPipe, Horovod)
sweep.py     every layout and placement of a scenario, the best of each system, records (backend=sim)
torch_runtime.py  the baselines as the harness runs them (torch pipelining + DDP/ZeRO-1 over gloo), for compare
compare.py   simulated vs measured iteration times from records of the shared schema; calibration
"""
