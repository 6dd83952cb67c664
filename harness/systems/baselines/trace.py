"""`--debug trace=1` for the baselines: every rank prints when each of its operations ran.

torch's pipelining schedules post and wait on their transfers inside `step()`, and DDP all-reduces
inside the last backward, so an iteration's seconds alone cannot say which transfer a rank waited on.
The trace prints one line per operation on stderr (the run's ranks.log):

    [trace] rank R stage J replica P it I OP K BEGIN END

OP is F or B (micro-batch K's forward or backward on this stage) or AR (DDP's all-reduce of gradient
bucket K, its bytes after END). BEGIN and END are wall-clock seconds: the ranks of one emulated
cluster share its kernel's clock, so lines of all ranks merge by time, and the gap before an operation
is the rank waiting on the transfer the schedule posted there. `sim compare`'s model of this runtime
(sim/torch_runtime.py) runs the same program; the trace is how its per-stage times are checked.
"""
from __future__ import annotations

import os
import time

from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook


class OpTrace:
    """Prints a rank's operations; `iteration` is set by the training loop."""

    def __init__(self, rank: int, stage: int, replica: int, fd: int = 2):
        self.where = f"rank {rank} stage {stage} replica {replica}"
        self.iteration = 0
        self.fd = fd

    def line(self, op: str, index: int, begin: float, end: float, extra: str = "") -> None:
        """One write per line: the ranks share stderr, and a pipe keeps a write this short whole."""
        text = f"[trace] {self.where} it {self.iteration} {op} {index} {begin:.4f} {end:.4f}{extra}\n"
        os.write(self.fd, text.encode())

    def wrap_stage(self, stage) -> None:
        """Time the pipeline stage's forward and backward of each micro-batch (on this instance only)."""
        for op, name in (("F", "forward_one_chunk"), ("B", "backward_one_chunk")):
            setattr(stage, name, self._timed(op, getattr(stage, name)))

    def _timed(self, op: str, fn):
        def run(chunk, *args, **kwargs):
            begin = time.time()
            result = fn(chunk, *args, **kwargs)
            self.line(op, int(chunk), begin, time.time())
            return result
        return run

    def hook_ddp(self, ddp) -> None:
        """DDP's own all-reduce (default_hooks.allreduce_hook: sum, then divide by the group's size),
        timed from the bucket's launch to its result."""
        def hook(group, bucket):
            begin, index, nbytes = time.time(), bucket.index(), bucket.buffer().numel() * bucket.buffer().element_size()

            def done(fut):
                self.line("AR", index, begin, time.time(), f" {nbytes}")
                return fut.value()
            return allreduce_hook(group, bucket).then(done)
        ddp.register_comm_hook(ddp.process_group, hook)
