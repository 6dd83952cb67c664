"""The placement of "ours": which device runs stage j of replica i.

`pipelines[i][j]` is the device of tasklet t(i, j) (the scheduler's Assignment
uses the same convention); rank == device id. Pipeline P_i is row i, data-parallel
group C_j is column j (ordered by replica, so member k of C_j owns shard k of the
stage's gradients).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import HarnessError

DP_SYNC_MODES = ("sharded-ps", "allreduce")
SCHEDULES = ("gpipe", "1f1b")


@dataclass(frozen=True)
class PipelineLayout:
    d_pp: int
    d_dp: int
    pipelines: tuple[tuple[int, ...], ...]  # [replica i][stage j] -> device
    dp_sync: str = "sharded-ps"
    schedule: str = "gpipe"
    recompute: bool = False  # activation recomputation per block (GPipe keeps every micro-batch's graph)

    def __post_init__(self):
        if len(self.pipelines) != self.d_dp or any(len(p) != self.d_pp for p in self.pipelines):
            raise HarnessError(f"layout.pipelines: expected {self.d_dp} rows of {self.d_pp} devices, "
                               f"got {[list(p) for p in self.pipelines]}")
        flat = sorted(d for p in self.pipelines for d in p)
        if flat != list(range(self.d_pp * self.d_dp)):
            raise HarnessError(f"layout.pipelines: must use every device 0..{self.d_pp * self.d_dp - 1} once, "
                               f"got {[list(p) for p in self.pipelines]}")
        if self.dp_sync not in DP_SYNC_MODES:
            raise HarnessError(f"layout.dp_sync: unknown {self.dp_sync!r} (known: {', '.join(DP_SYNC_MODES)})")
        if self.schedule not in SCHEDULES:
            raise HarnessError(f"layout.schedule: unknown {self.schedule!r} (known: {', '.join(SCHEDULES)})")

    @property
    def world_size(self) -> int:
        return self.d_pp * self.d_dp

    def position(self, device: int) -> tuple[int, int]:
        """(replica i, stage j) of a device."""
        for i, p in enumerate(self.pipelines):
            if device in p:
                return i, p.index(device)
        raise HarnessError(f"layout: device {device} is not placed")

    def stage_group(self, j: int) -> list[int]:
        """C_j: the devices running stage j, in replica order."""
        return [p[j] for p in self.pipelines]

    def to_json(self) -> dict:
        return {"d_pp": self.d_pp, "d_dp": self.d_dp, "pipelines": [list(p) for p in self.pipelines],
                "dp_sync": self.dp_sync, "schedule": self.schedule, "recompute": self.recompute}

    @classmethod
    def from_json(cls, d: dict) -> "PipelineLayout":
        try:
            return cls(int(d["d_pp"]), int(d["d_dp"]), tuple(tuple(int(x) for x in p) for p in d["pipelines"]),
                       d.get("dp_sync", "sharded-ps"), d.get("schedule", "gpipe"),
                       bool(d.get("recompute", False)))
        except (KeyError, TypeError, ValueError) as e:
            raise HarnessError(f"layout: malformed ({type(e).__name__}: {e})") from None


def identity_layout(d_pp: int, d_dp: int, **kw) -> PipelineLayout:
    """Replica i runs on devices i*d_pp .. i*d_pp + d_pp - 1, in stage order."""
    return PipelineLayout(d_pp, d_dp, tuple(tuple(i * d_pp + j for j in range(d_pp)) for i in range(d_dp)), **kw)
