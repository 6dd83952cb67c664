"""A quorum system's quorums (its registry entry's recovery="quorum": DiLoCo on torchft), as the spot predictor
(sim/preemption.py) needs them: how often a replica meets the others, how long their quorum waits for one lost,
what one back receives to heal. The system gives its numbers (registry quorum_model); the physics is here."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class QuorumModel:
    """What the predictor needs of a system's quorums (its registry entry's quorum_model gives it)."""
    turn: int  # a replica's inner steps between two of its quorums
    heartbeat_timeout_s: float  # a replica silent this long is out of the next quorum
    join_timeout_s: float  # how long a quorum waits, from its first request, for a replica still heartbeating
    heal_bytes: float  # the state a replica back receives from a peer

    def wait_s(self, to_quorum_s: float) -> float:
        """How long the survivors' quorum waits past their own request for a replica lost `to_quorum_s` before it:
        until its heartbeats have stopped (then every healthy replica has asked), at most the join timeout."""
        return max(0.0, min(self.heartbeat_timeout_s - to_quorum_s, self.join_timeout_s))

    def heal_s(self, links, peer: int, device: int) -> float:
        """The peer's state to a replica back: a fresh connection over the link (torchft's HTTP transport)."""
        path = links.path(np.array([peer]), np.array([device]))
        return float(path.rtt_s[0] + path.transfer(np.array([self.heal_bytes]), path.initial_window())[0][0])
