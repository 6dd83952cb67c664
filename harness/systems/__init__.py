"""The built-in systems, one package each: its registry entry (harness/plan/systems.py: `System`), its layout
rule and the code that is its own (HetPipe's virtual workers, its simulator model and report section).
Rank functions and simulator models that share machinery with other systems (pipelines, collectives)
live in harness/train/ and harness/sim/, and the entry names them.

Importing this package registers the systems in this order (the order of --help and of every table);
the registry imports it, so every lookup sees them. A new system: its package here and its line below.
"""
from . import ours, megatron, deepspeed, hetpipe, horovod  # noqa: F401,E401  (registration)
