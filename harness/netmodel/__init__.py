"""The network model: one place for what a link is and how TCP and fair sharing behave on it, used by the
shaping plan and `net verify` (harness/network/), every simulator model (harness/sim/, harness/systems/*/sim.py),
the cost model's matrices and the federated-learning round.

tcp.py          TCP's headers (payload share of a shaped link), slow start, a message's time on one connection
fair_share.py   max-min fair rates of flows that share capacities (progressive filling)
links.py        every device pair's delay and rate, each device's interface, the library's protocol; connections
collectives.py  ring all-reduce / all-gather, the sharded parameter server, gloo's barrier, as point-to-point steps
"""
