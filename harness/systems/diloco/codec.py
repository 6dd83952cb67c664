"""The pseudo-gradients on the wire: fp32 as torchft sends them, bf16, or int8 as INTELLECT-1 sends them.

torchft's Manager averages a pseudo-gradient by calling its process group's `allreduce([t], SUM)` and dividing
by the participants; a replica's process group here is torchft's reconfigurable ProcessGroupGloo (the quorum
rebuilds it), with the encoding in that one call:
- fp32: gloo's ring all-reduce of the tensor, as torchft does;
- bf16: the same ring on a bf16 copy (gloo sums bf16), the sum copied back: half the bytes;
- int8: a ring of int8 chunks with one fp32 scale per block of BLOCK values (absmax), each rank adding its own
  chunk and quantizing again on the way (INTELLECT-1's all-reduce), then the sums gathered round the ring: 2 (p - 1)
  / p bytes a value leave each rank, a quarter of fp32's (scales aside), over the ring's links as fp32's do.
  torchft's own quantized all-reduce (collectives.allreduce_quantized) is fp8 in Triton kernels, CUDA only, and an
  all-to-all: every rank sends to every other, so across slow links (regions, continents) it would carry more than
  a ring of fp32 does. Every replica ends with the same dequantized sum; the error grows with the hops, each a
  rounding to 1/254 of a block's running largest value.
"""
from __future__ import annotations

import concurrent.futures
from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp
from torchft.process_group import ProcessGroupGloo

from .settings import BYTES_ON_WIRE, INT8_BLOCK as BLOCK, INT8_SCALE_OVERHEAD, WIRE_FORMATS, int8_chunk


class FutureWork(dist._Work):
    """A Work that completes with a future (what the Manager chains its averaging on)."""

    def __init__(self, fut: torch.futures.Future):
        super().__init__()
        self.fut = fut

    def wait(self, timeout=None) -> bool:
        self.fut.wait()
        return True

    def get_future(self) -> torch.futures.Future:
        return self.fut


def quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 values and an fp32 scale per block of BLOCK values (x's length a multiple of BLOCK)."""
    blocks = x.view(-1, BLOCK)
    scale = blocks.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127.0
    return torch.round(blocks / scale[:, None]).clamp_(-127, 127).to(torch.int8).view(-1), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (q.view(-1, BLOCK).float() * scale[:, None]).view(-1)


def int8_allreduce_sum(pg, x: torch.Tensor) -> None:
    """Sum flat fp32 `x` over `pg` in place, as a ring of int8 chunks (INTELLECT-1's all-reduce): p - 1 steps of
    reduce-scatter, each rank sending its running chunk quantized to the next, which adds its own and quantizes
    again; then p - 1 steps of all-gather of the summed chunks as they are. Every rank ends with the same values."""
    p, n = pg.size(), x.numel()
    me = pg.parent.rank()
    chunk = int8_chunk(n, p)
    flat = torch.zeros(chunk * p, dtype=torch.float32)
    flat[:n] = x.reshape(-1)
    parts = list(flat.view(p, chunk))
    to, frm = (me + 1) % p, (me - 1) % p

    def exchange(q: torch.Tensor, scale: torch.Tensor, tag: int) -> tuple[torch.Tensor, torch.Tensor]:
        got_q, got_s = torch.empty_like(q), torch.empty_like(scale)
        works = [pg.send([q], to, tag), pg.send([scale], to, tag + 1),
                 pg.recv([got_q], frm, tag), pg.recv([got_s], frm, tag + 1)]
        for w in works:
            w.wait()
        return got_q, got_s

    for step in range(p - 1):  # reduce-scatter: chunk (me - step) goes on, chunk (me - step - 1) comes in
        q, scale = quantize(parts[(me - step) % p])
        got_q, got_s = exchange(q, scale, 2 * step)
        k = (me - step - 1) % p
        parts[k] = parts[k] + dequantize(got_q, got_s)
    done = (me + 1) % p  # the chunk this rank summed whole
    q, scale = quantize(parts[done])
    parts[done] = dequantize(q, scale)  # as every other rank will have it
    for step in range(p - 1):  # all-gather: the summed chunks travel on, quantized once
        got_q, got_s = exchange(q, scale, 2 * (p + step))
        k = (me - step) % p
        parts[k] = dequantize(got_q, got_s)
        q, scale = got_q, got_s
    x.copy_(torch.cat(parts)[:n].view_as(x))


class WireProcessGroup(ProcessGroupGloo):
    """torchft's ProcessGroupGloo whose sum all-reduces send `wire` values; `on_send(bytes)` is told what each
    call puts on the wire from this rank (the ring's and the quantized algorithm's payload: wire.py's rules)."""

    def __init__(self, wire: str, timeout, on_send: Callable[[int], None] = lambda b: None):
        super().__init__(timeout=timeout)
        if wire not in WIRE_FORMATS:
            raise ValueError(f"wire: must be one of {', '.join(WIRE_FORMATS)} (got {wire!r})")
        self.wire, self.on_send = wire, on_send
        self._set_aside = []  # the groups of past quorums (configure)
        self._int8 = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="int8-allreduce")

    def _charge(self, nbytes: float) -> None:
        p = self.size()
        self.on_send(int(2 * (p - 1) / p * nbytes))

    def allreduce(self, tensors, opts) -> dist._Work:
        op = opts.reduceOp if hasattr(opts, "reduceOp") else opts
        t = tensors[0] if len(tensors) == 1 else None
        if self.wire == "fp32" or t is None or op != ReduceOp.SUM or t.dtype != torch.float32:
            for x in tensors:
                self._charge(x.numel() * x.element_size())
            return super().allreduce(tensors, opts)
        if self.wire == "bf16":
            self._charge(t.numel() * 2)
            low = t.to(torch.bfloat16)
            work = super().allreduce([low], opts)
            return FutureWork(work.get_future().then(lambda _: t.copy_(low)))
        p = self.size()
        self._charge(int8_chunk(t.numel(), p) * p * INT8_SCALE_OVERHEAD)  # values and scales
        fut = torch.futures.Future()

        def run():
            try:
                int8_allreduce_sum(self, t)
                fut.set_result([t])
            except Exception as e:  # the Manager sees it as a failed all-reduce (its quorum goes on)
                fut.set_exception(e)

        self._int8.submit(run)
        return FutureWork(fut)

    def configure(self, *args, **kwargs) -> None:
        """The group of a new quorum; the last quorum's is set aside, not aborted as torchft's wrapper does. gloo's
        abort of a group whose all-reduce had failed on one peer's closed connection (a pipeline replica's other
        stage, killed with the lost one) while its send to a live peer was still under way on a slow link hung
        the rank past the Manager's timeout, and the run failed at its next sync (emulated case 5 at x0.00128;
        set aside, the run went through). Its sockets close with the rank; a quorum changes only when a replica
        leaves or comes back, so few are kept."""
        old, self._pg = self._pg, None
        if old is not None:
            self._set_aside.append(old)
        super().configure(*args, **kwargs)

    def shutdown(self) -> None:
        self._int8.shutdown(wait=False, cancel_futures=True)
        super().shutdown()
