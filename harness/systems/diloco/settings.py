"""DiLoCo's knobs, as the papers and torchft name them, checked once for the layout rule, the ranks and the
simulator alike (a bad one is one line naming its flag).

Defaults: the outer optimizer of DiLoCo (Douillard et al. 2023): SGD with Nesterov momentum 0.9 at lr 0.7; H
(`sync_every`) 100 inner steps, INTELLECT-1's (DiLoCo's paper found 500 as good at its scale; a short emulated
run wants fewer: `--sync-every`); the inner AdamW at lr 1e-3 (DiLoCo's 4e-4 is for its 150M-parameter model
with warm-up; this harness trains small GPTs for few steps). `--inner-optimizer sgd` is every other system's
optimizer (SGD with momentum at `--lr`): with it, H = 1, an outer lr of 1 and no outer momentum is synchronous
data parallelism exactly (the average of the replicas' steps is the step on the averaged gradient, since SGD's
step and momentum are linear in the gradient; AdamW's are not).

The Lighthouse forms a quorum as soon as every replica of the last quorum that still heartbeats has asked; one
that stopped (preempted) is waited for `join_timeout` seconds from the round's first request (torchft's default,
60 s): what a lost replica costs the others at their next sync. A replica lost inside a sync costs the others
`sync_timeout` (torchft's Manager timeout, on each all-reduce, should_commit and heal; default the run's
process-group timeout, 300 s at most): the peer's packets vanish with its links, so only the timeout tells; the sync
is then dropped (should_commit is false: the parameters go back to the last sync's) and the next quorum is formed
without it. Shorter is quicker through a loss, but a sync or a heal that needs longer fails as if a peer were lost.

Streaming DiLoCo (Douillard et al. 2025): the model in `fragments` of consecutive blocks (the embedding with the
first, the head with the last; replicas that are pipelines: each stage so cut, pipeline_replicas.py); torchft
syncs one fragment every H / fragments steps in turn, so each is synced every H steps; a fragment's all-reduce
starts `fragment_sync_delay` inner steps before it is needed (tau, overlap with compute), and
`fragment_update_alpha` mixes the local parameters into the synced ones (0: the synced only).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...errors import HarnessError

WIRE_FORMATS = ("fp32", "bf16", "int8")  # the pseudo-gradients on the wire (codec.py)
BYTES_ON_WIRE = {"fp32": 4, "bf16": 2, "int8": 1}  # a value's bytes (int8's scales aside)
INT8_BLOCK = 1024  # int8 values that share one fp32 scale (codec.py)
INT8_SCALE_OVERHEAD = 1 + 4 / INT8_BLOCK  # an int8 value's bytes with its share of the scale


def int8_chunk(values: int, ranks: int) -> int:
    """Each rank's chunk of `values` in codec.py's int8 ring: an even share, in whole blocks."""
    return -(-values // (ranks * INT8_BLOCK)) * INT8_BLOCK


def fragment_cuts(layers: int, fragments: int) -> list[int]:
    """Where Streaming DiLoCo's fragments of consecutive blocks begin and end, as even as they go."""
    return [round(i * layers / fragments) for i in range(fragments + 1)]


@dataclass(frozen=True)
class DiLoCoSettings:
    sync_every: int = 100
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    inner_optimizer: str = "adamw"
    inner_lr: float = 1e-3
    wire: str = "fp32"
    replicas: int | None = None  # None: one per device
    replica_stages: int = 1  # > 1: a replica is one of ours' pipelines of that many stages
    lighthouse_device: int = 0
    join_timeout: float = 60.0  # torchft's Lighthouse default: how long a quorum waits for a replica of the last one
    sync_timeout: float | None = None  # torchft's Manager timeout; None: the run's process-group timeout
    fragments: int = 1
    fragment_sync_delay: int = 0
    fragment_update_alpha: float = 0.0

    @classmethod
    def of(cls, options: dict, devices: int, layers: int | None = None) -> "DiLoCoSettings":
        """The settings of a run's options (the system's, resolved) on `devices` devices, checked."""
        known = {k: v for k, v in options.items() if k in cls.__dataclass_fields__ and v is not None}
        s = cls(**known)
        s.check(devices, layers)
        return s

    def devices_per_replica(self, devices: int) -> int:
        return devices // (self.replicas or devices)

    def check(self, devices: int, layers: int | None = None) -> None:
        if self.sync_every < 1:
            raise HarnessError(f"--sync-every: must be at least 1 inner step (got {self.sync_every})")
        if not 0 < self.outer_lr <= 1:
            raise HarnessError(f"--outer-lr: must be in (0, 1] (got {self.outer_lr})")
        if not 0 <= self.outer_momentum < 1:
            raise HarnessError(f"--outer-momentum: must be in [0, 1) (got {self.outer_momentum})")
        if self.wire not in WIRE_FORMATS:
            raise HarnessError(f"--wire: must be one of {', '.join(WIRE_FORMATS)} (got {self.wire!r})")
        if self.replica_stages > 1:
            p = self.replica_stages
            if self.replicas is not None:
                raise HarnessError(f"--replicas: with --replica-stages {p} a replica is one of ours' pipelines "
                                   f"({devices // p} of {p} devices); give one or the other")
            if devices % p or devices // p < 2 or (layers is not None and p > layers):
                raise HarnessError(f"--replica-stages: {p} stages a pipeline must split the {devices} devices into "
                                   f"at least 2 pipelines{'' if layers is None else f', and the {layers} blocks'}")
            if layers is not None and self.fragments > layers // p:
                raise HarnessError(f"--fragments: {self.fragments} fragments are cut inside each of the {p} stages, "
                                   f"which hold {layers // p} of the {layers} blocks")
        r = self.replicas or devices
        if r < 1 or devices % r:
            raise HarnessError(f"--replicas: {r} replicas do not split the {devices} devices evenly (a replica is "
                               f"devices / replicas consecutive devices)")
        if r < 2:
            raise HarnessError(f"--replicas: DiLoCo needs at least 2 replicas (got {r} on {devices} devices)")
        if not 0 <= self.lighthouse_device < devices:
            raise HarnessError(f"--lighthouse-device: device {self.lighthouse_device} is not in the run "
                               f"(devices 0..{devices - 1})")
        if layers is not None and not 1 <= self.fragments <= layers:
            raise HarnessError(f"--fragments: must be 1 to the model's {layers} blocks (got {self.fragments})")
        if self.sync_every % self.fragments:
            raise HarnessError(f"--sync-every: {self.sync_every} inner steps do not split into {self.fragments} "
                               "fragments' turns (torchft syncs one fragment every H / fragments steps)")
        turn = self.sync_every // self.fragments
        if not 0 <= self.fragment_sync_delay < turn:
            raise HarnessError(f"--fragment-sync-delay: must be 0 to {turn - 1}, under a fragment's turn of "
                               f"{turn} inner steps (got {self.fragment_sync_delay})")
        if not 0 <= self.fragment_update_alpha <= 1:
            raise HarnessError(f"--fragment-update-alpha: must be in [0, 1] (got {self.fragment_update_alpha})")
