"""OWL's federated-learning workload (Han et al. 2024, `../shared/seeds/002_*`): a server and racks of
workers; before every round each worker needs the whole model, and strategies differ in how the
parameters reach it. Not GPT training: its own models (branch graphs), plans, simulator and records.

federation.py  scenario -> server + racks (alpha, scale-down by whole racks)
models.py      branchy models: Inception-v4, DFN, a tiny CPU model, as bases of parallel branches
nets.py        a runnable model (tiny, mini-inception) as a PyTorch module, built from its profile
grouping.py    Algorithm 1 (largest branch into the smallest group) and the exact grouping
flows.py       max-min fair transfers from the server and between workers, then each worker's forward
strategies.py  naive / overlap / ipart / owl / optimal: one registry, one interface
records.py     the FL record and where it is written
"""
