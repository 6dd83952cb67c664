"""The built-in systems, one package each: its registry entry (harness/plan/systems.py: `System`), its layout
rule, its rank function, its simulator model, its regression-gate runs and its report section, as far as
it has them. baselines/ is the runtime and the simulator models megatron and deepspeed share (and
`harness tune`); what every runtime and every model shares is below, in harness/train/ and harness/sim/.

Importing this package registers the systems in this order (the order of --help and of every table);
the registry imports it, so every lookup sees them. A new system: its package here and its line below.
"""
from . import ours, megatron, deepspeed, hetpipe, horovod, dtfm, diloco  # noqa: F401,E401  (registration)
