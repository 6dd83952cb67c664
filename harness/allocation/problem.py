"""The allocation problem of one pipeline (devices in stage order, blocks to share out) and its answer."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import HarnessError


class AllocationError(HarnessError, ValueError):
    """No allocation can run (too few blocks, a device without memory for its share); one line."""


@dataclass(frozen=True)
class Problem:
    """What an allocator sees, for D devices in pipeline order and L blocks.

    seconds_per_flop: (D,) dt_i; block_flop: (L,) lf_j; fixed_seconds: (D,) ct_i plus the device's
    fixed work (embedding on the first, head on the last); block_memory: (L,) lm_j bytes;
    memory: (D,) dm_i bytes the blocks may use (the device's memory less its fixed parts).

    Two optional terms for models whose cuts differ (a CNN's activations shrink layer by layer;
    HetPipe's partitioner, Park et al. 2020 Sec. 7, counts them), taken by `even` and `optimal`:
    receive_seconds (2, D, L+1): [0, i, a] device i receiving its input when its range starts at
    block a, [1, i, b] receiving the gradient back when its range ends at b; device_block_memory
    (D, L): lm_j on device i when it differs per device (activations kept for more micro-batches
    on earlier stages)."""

    seconds_per_flop: np.ndarray
    block_flop: np.ndarray
    fixed_seconds: np.ndarray
    block_memory: np.ndarray
    memory: np.ndarray
    names: tuple[str, ...] = ()  # the devices' names, for messages
    receive_seconds: np.ndarray | None = None
    device_block_memory: np.ndarray | None = None

    @property
    def uniform(self) -> bool:
        """No cut-dependent or per-device term: every allocator applies."""
        return self.receive_seconds is None and self.device_block_memory is None

    @property
    def devices(self) -> int:
        return len(self.seconds_per_flop)

    @property
    def blocks(self) -> int:
        return len(self.block_flop)

    def name(self, i: int) -> str:
        return self.names[i] if self.names else f"device {i}"

    def stage_seconds(self, counts) -> np.ndarray:
        """w_i of every device for blocks-per-device `counts`."""
        w = self.seconds_per_flop * _range_sums(self.block_flop, counts) + self.fixed_seconds
        if self.receive_seconds is not None:
            bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
            i = np.arange(self.devices)
            w = w + self.receive_seconds[0, i, bounds[:-1]] + self.receive_seconds[1, i, bounds[1:]]
        return w

    def stage_memory(self, counts) -> np.ndarray:
        if self.device_block_memory is None:
            return _range_sums(self.block_memory, counts)
        return np.array([_range_sums(row, counts)[i] for i, row in enumerate(self.device_block_memory)])

    def overflow(self, counts) -> float:
        """Bytes over memory of blocks-per-device `counts`, summed over devices (0 when they fit)."""
        return float(np.maximum(self.stage_memory(counts) - self.memory, 0).sum())

    def _block_memory(self, i: int) -> np.ndarray:
        return self.block_memory if self.device_block_memory is None else self.device_block_memory[i]

    def check(self) -> None:
        if self.blocks < self.devices:
            raise AllocationError(f"allocation: {self.blocks} blocks cannot give {self.devices} devices one each")
        least = np.array([self._block_memory(i).min() for i in range(self.devices)])
        small = np.flatnonzero(self.memory < least)
        if small.size:
            i = int(small[0])
            raise AllocationError(f"allocation: {self.name(i)} has {self.memory[i] / 2**30:.2f} GiB for blocks, "
                                  f"less than one block needs ({least[i] / 2**30:.2f} GiB)")


def _range_sums(values: np.ndarray, counts) -> np.ndarray:
    """Sum of `values` over each device's contiguous range, for blocks-per-device `counts`."""
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    prefix = np.concatenate([[0.0], np.cumsum(values)])
    return prefix[bounds[1:]] - prefix[bounds[:-1]]


@dataclass(frozen=True)
class Allocation:
    allocator: str
    layers_per_device: tuple[int, ...]
    stage_seconds: tuple[float, ...]
    solve_seconds: float
    optimal: bool = False  # proven optimal (optimal; sky-mip when HiGHS closed the gap)

    @property
    def bottleneck(self) -> int:
        return int(np.argmax(self.stage_seconds))

    @property
    def stages(self) -> tuple[tuple[int, int], ...]:
        """[first, last) blocks of every device, as Layout.stages."""
        b = np.concatenate([[0], np.cumsum(self.layers_per_device)]).astype(int)
        return tuple((int(x), int(y)) for x, y in zip(b[:-1], b[1:]))
