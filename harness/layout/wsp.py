"""How a layout's pipelines synchronise when they train asynchronously: HetPipe's Wave Synchronous Parallel.

A layout with `wsp` set runs each replica (a virtual worker, VW) as its own pipeline with `in_flight`
(N_m) minibatches in flight and local updates after each; the VWs meet only at a sharded parameter
server, pushing each wave's aggregated update and pulling the global weights so that no VW runs more
than `staleness` (D) waves ahead of the slowest (harness/systems/hetpipe/wsp.py). `ps_hosts[l]` is
the device whose rank hosts the parameter-server shard holding block l (its node's shard: HetPipe
places shards on the nodes; the embeddings go with block 0, the head with the last block).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import HarnessError


class WSPError(HarnessError, ValueError):
    """A malformed synchronisation section; str() is one line naming the field."""


@dataclass(frozen=True)
class WSP:
    in_flight: int  # N_m: minibatches in flight per VW, a wave
    staleness: int  # D: the clock distance bound
    ps_hosts: tuple[int, ...]  # per block: the device hosting its parameter-server shard
    policy: str = ""  # how the VWs were formed (HetPipe's resource allocation policy)
    ps_placement: str = ""  # how the shards were placed (default | local)

    def __post_init__(self):
        for name, low in (("in_flight", 1), ("staleness", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise WSPError(f"layout.wsp.{name}: must be an integer >= {low} (got {v!r})")
        if not self.ps_hosts or not all(isinstance(d, int) and d >= 0 for d in self.ps_hosts):
            raise WSPError(f"layout.wsp.ps_hosts: one device id per block (got {self.ps_hosts!r})")

    @property
    def shard_hosts(self) -> tuple[int, ...]:
        """The devices hosting a shard, ascending."""
        return tuple(sorted(set(self.ps_hosts)))

    def to_json(self) -> dict:
        return {"in_flight": self.in_flight, "staleness": self.staleness, "ps_hosts": list(self.ps_hosts),
                "policy": self.policy, "ps_placement": self.ps_placement}

    @classmethod
    def from_json(cls, d) -> "WSP":
        if not isinstance(d, dict):
            raise WSPError(f"layout.wsp: must be a mapping (got {d!r})")
        try:
            return cls(**{**d, "ps_hosts": tuple(int(x) for x in d.get("ps_hosts", ()))})
        except TypeError as e:
            raise WSPError(f"layout.wsp: malformed ({e})") from None
