"""OWL (Han et al. 2024, `../shared/seeds/002_*`) for real: a strategy's plan of transfers run by a server
and racks of workers, each a process in its own namespace of the emulated cluster.

The plans and the simulator are the workload's (harness/workloads/fl/); here they run.

runtime.py   one process: the server sends the plan's transfers, a worker receives, relays and computes
launcher.py  the processes of one cluster boot (`python -m harness.systems.owl.launcher SPEC OUT`), or on loopback
emulated.py  the host's side: plans, the emulated cluster, measured FL records
compare.py   `sim compare` for FL records: the flow simulation of each measured round
"""
