"""The baselines as the harness runs them: torch.distributed.pipelining + DDP (+ ZeRO-1) over gloo.

`harness run --system megatron|deepspeed` (harness/systems/baselines/) steps PyTorch's own
Schedule1F1B / ScheduleGPipe. Its communication differs from Megatron-LM's in three
ways that decide an iteration on slow links, so `sim compare` simulates this runtime
for measured baseline records instead of the paper-scale model (harness/systems/baselines/sim.py):

- Every point-to-point transfer is posted only when the schedule reaches it and gloo's
  send is a rendezvous: data leaves once the receiver's ready notice has arrived (one
  one-way delay after the receive was posted, PROTOCOLS). Each stage waits on
  its posted work exactly where the schedule code waits: receives before computing,
  a forward send fused with the next backward's receive in 1F1B, the previous send
  before posting the next (torch/distributed/pipelining/schedules.py).
- DDP reduces gradients inside the last micro-batch's backward (pipelining calls it
  outside `no_sync`), so a stage all-reduces before it sends its last gradient back:
  the data-parallel syncs of the stages follow one another down the pipeline, where
  Megatron-LM starts them all after the flush.
- ZeroRedundancyOptimizer broadcasts every parameter tensor from the rank that owns
  it after the step (one gloo broadcast per tensor, at most `GLOO_THREADS` in flight
  per process), each a rendezvous.

Every rank's optimizer step (over its stage, or its ZeRO-1 shard of it) follows its
gradient all-reduce and precedes the broadcasts.

A send completes when its last byte has left (departure + bytes / rate, or more under the scenario's
TCP settings: netmodel/links.Connections, one per device pair through the iteration, so that a message
after a silence longer than the RTO restarts slow start); it arrives one delay later. Transfers on one
ordered pair go out one after another.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..layout import Layout
from ..compute.model import GPTConfig
from .. import compute as work
from ..netmodel import collectives
from ..netmodel.links import Connections, Links
from .systems import SimError, check_layers, optimizer_step

#: ProcessGroupGloo's worker threads (torch's default Options: 2): collectives in flight per process.
GLOO_THREADS = 2


def schedule_program(schedule: str, P: int, M: int, j: int) -> list[tuple]:
    """The ops stage j issues in one step of torch's schedule, in order.

    ("post", [msg, ...]) posts sends/receives; ("wait", [msg, ...]) blocks until they complete;
    ("F", m) / ("B", m) compute; ("reduce",) is DDP's all-reduce, run inside the last backward.
    A msg is (side, kind, m): side "send" or "recv", kind "act" (forward, j-1 -> j -> j+1) or
    "grad" (backward, j+1 -> j -> j-1)."""
    first, last = j == 0, j == P - 1

    def recv_act(m):
        return [] if first else [("recv", "act", m)]

    def send_act(m):
        return [] if last else [("send", "act", m)]

    def recv_grad(m):
        return [] if last else [("recv", "grad", m)]

    def send_grad(m):
        return [] if first else [("send", "grad", m)]

    def both(msgs):
        return [("post", msgs), ("wait", msgs)] if msgs else []

    def backward(m):
        return [("B", m)] + ([("reduce",)] if m == M - 1 else [])

    ops: list[tuple] = []
    if schedule == "gpipe":
        sends = []
        for m in range(M):
            ops += both(recv_act(m)) + [("F", m)]
            if send_act(m):
                ops.append(("post", send_act(m)))
                sends += send_act(m)
        if sends:
            ops.append(("wait", sends))
        sends = []
        for m in range(M):
            ops += both(recv_grad(m)) + backward(m)
            if send_grad(m):
                ops.append(("post", send_grad(m)))
                sends += send_grad(m)
        return ops + ([("wait", sends)] if sends else [])
    if schedule != "1f1b":
        raise ValueError(f"unknown pipeline schedule {schedule!r}")
    warm = min(M, P - j)
    f = b = 0
    send_work: list = []
    pending: list = []
    for _ in range(warm):
        ops += both(recv_act(f)) + [("F", f)]
        if send_work:
            ops.append(("wait", send_work))
            send_work = []
        if f != warm - 1:
            if send_act(f):
                ops.append(("post", send_act(f)))
            send_work = send_act(f)
        else:
            pending = send_act(f)
        f += 1
    while True:
        ops += both(pending + recv_grad(b)) + backward(b)
        bsend = send_grad(b)
        b += 1
        if f == M:
            break
        ops += both(bsend + recv_act(f)) + [("F", f)]
        pending = send_act(f)
        f += 1
    if bsend:
        ops.append(("post", bsend))
    send_work = bsend
    while b < M:
        ops += both(recv_grad(b)) + backward(b)
        if send_work:
            ops.append(("wait", send_work))
        send_work = send_grad(b)
        if send_work:
            ops.append(("post", send_work))
        b += 1
    return ops + ([("wait", send_work)] if send_work else [])


@dataclass
class _Message:
    src: int  # device ids
    dst: int
    nbytes: float
    send_post: float | None = None
    recv_post: float | None = None
    sent: float | None = None  # last byte left the sender
    arrived: float | None = None


def stage_tensor_bytes(cfg: GPTConfig, split: list[int], bytes_per_value: int) -> list[list[float]]:
    """Bytes of every parameter tensor of each stage, in module order (harness/train/gpt.py)."""
    h, f = cfg.hidden, cfg.ffn_mult * cfg.hidden
    block = [h, h, h * h, h, h * h, h, h * h, h, h * h, h, h, h, h * f, f, f * h, h]
    out = []
    d_pp = len(split)
    for j, n in enumerate(split):
        t = ([cfg.vocab * h, cfg.seq * h] if j == 0 else []) + block * n + ([h, h, h * cfg.vocab] if j == d_pp - 1 else [])
        out.append([float(x * bytes_per_value) for x in t])
    return out


def zero1_owner(tensor_bytes: list[float], ranks: int) -> list[int]:
    """ZeroRedundancyOptimizer's partition: tensors by decreasing size, each to the least-loaded rank."""
    load = [0.0] * ranks
    owner = [0] * len(tensor_bytes)
    for i in sorted(range(len(tensor_bytes)), key=lambda i: -tensor_bytes[i]):
        r = int(np.argmin(load))
        owner[i] = r
        load[r] += tensor_bytes[i]
    return owner


def broadcasts(links: Links, members: np.ndarray, start: np.ndarray, tensors: list[float], owner: list[int],
               threads: int = GLOO_THREADS, conns: Connections | None = None) -> np.ndarray:
    """End time of every member after one gloo broadcast per tensor (root = its owner), in order.

    A member runs broadcast k on the first of its `threads` workers to free up; the root sends to
    every other member once that member's worker has started k and its ready notice arrived (a
    flat tree: exact for the two-member groups the emulated runs use)."""
    D = len(members)
    free = np.repeat(np.asarray(start, dtype=float)[:, None], threads, axis=1)  # (D, threads)
    h = links.protocol.p2p_handshake
    conns = Connections(links) if conns is None else conns
    for nbytes, root in zip(tensors, owner):
        w = free.argmin(1)
        begin = free[np.arange(D), w]
        end = begin.copy()
        for q in range(D):
            if q == root:
                continue
            s, d = members[root], members[q]
            depart = max(begin[root], begin[q] + h * links.delay_s[d, s], conns.last_sent[s, d])
            sent = depart + float(conns.send(s, d, nbytes, depart))
            end[root] = max(end[root], sent)
            end[q] = sent + links.delay_s[s, d]
        free[np.arange(D), w] = end
    return free.max(1)


def simulate(links: Links, profiles, cfg: GPTConfig, batch: int, layout: Layout, micro_batch: int = 1,
             bytes_per_value: int = work.PAPER_BYTES) -> tuple[float, float, dict]:
    """Seconds of one iteration of the torch-pipelining baseline on the layout (tp = 1; its schedule
    and ZeRO stage 0 or 1).

    Returns (seconds, busiest device's compute seconds, details). The baselines keep activations
    (no recompute). Tensor parallelism is not modelled here (the emulated runs that `sim compare`
    checks use D_TP = 1)."""
    if layout.tp != 1:
        raise SimError(f"torch runtime model: tensor parallelism is not modelled (tp = {layout.tp})")
    dev = layout.array()[:, :, 0]
    P, R = dev.shape
    schedule, zero, split = layout.schedule, layout.zero, layout.layers_per_stage
    M = work.micro_batches(batch, micro_batch, R, "data-parallel replicas")
    check_layers(cfg, P)
    fwd, bwd = work.stage_compute(cfg, split, micro_batch, profiles, dev.T, recompute=False)  # (R, P)
    act = work.activation_bytes(cfg, micro_batch, bytes_per_value)
    grads = work.stage_param_bytes(cfg, split, bytes_per_value)
    programs = [schedule_program(schedule, P, M, j) for j in range(P)]
    msgs: dict[tuple, _Message] = {}
    h = links.protocol.p2p_handshake
    conns = Connections(links)  # one per device pair: the pipeline's, the all-reduce's, ZeRO's broadcasts

    def message(kind: str, r: int, src_stage: int, m: int) -> _Message:
        key = (kind, r, src_stage, m)
        if key not in msgs:
            dst_stage = src_stage + 1 if kind == "act" else src_stage - 1
            msgs[key] = _Message(int(dev[src_stage, r]), int(dev[dst_stage, r]), act)
        return msgs[key]

    def lookup(msg, j, r) -> _Message:
        side, kind, m = msg
        if side == "send":
            return message(kind, r, j, m)
        return message(kind, r, j - 1 if kind == "act" else j + 1, m)

    def resolve(x: _Message) -> None:
        if x.sent is not None or x.send_post is None or x.recv_post is None:
            return
        depart = max(x.send_post, x.recv_post + h * links.delay_s[x.dst, x.src], conns.last_sent[x.src, x.dst])
        x.sent = depart + float(conns.send(x.src, x.dst, x.nbytes, depart))
        x.arrived = x.sent + links.delay_s[x.src, x.dst]

    t = np.zeros((P, R))
    ptr = np.zeros((P, R), dtype=int)
    reduce_at = np.full((P, R), np.nan)
    reduce_end: dict[int, np.ndarray] = {}
    remaining = sum(len(programs[j]) for j in range(P)) * R
    while remaining:
        progressed = False
        for j in range(P):
            for r in range(R):
                prog = programs[j]
                while ptr[j, r] < len(prog):
                    op = prog[ptr[j, r]]
                    if op[0] == "post":
                        for msg in op[1]:
                            x = lookup(msg, j, r)
                            if msg[0] == "send":
                                x.send_post = t[j, r]
                            else:
                                x.recv_post = t[j, r]
                            resolve(x)
                    elif op[0] == "wait":
                        xs = [(msg[0], lookup(msg, j, r)) for msg in op[1]]
                        if any(x.sent is None for _, x in xs):
                            break
                        t[j, r] = max([t[j, r]] + [x.sent if side == "send" else x.arrived for side, x in xs])
                    elif op[0] == "F":
                        t[j, r] += fwd[r, j]
                    elif op[0] == "B":
                        t[j, r] += bwd[r, j]
                    elif op[0] == "reduce":
                        reduce_at[j, r] = t[j, r]
                        if R > 1:
                            if j not in reduce_end:
                                if np.isnan(reduce_at[j]).any():
                                    break
                                reduce_end[j] = collectives.ring_allreduce(links, dev[j][None, :], grads[j],
                                                                       start=reduce_at[j][None, :], conns=conns)[0]
                            t[j, r] = reduce_end[j][r]
                    ptr[j, r] += 1
                    remaining -= 1
                    progressed = True
        if not progressed:
            raise RuntimeError("torch pipeline schedule deadlocked")  # a bug, never a user error
    # the step over each rank's parameters (ZeRO-1: its shard; an even 1/R share, as ZeRO's paper has it)
    opt = optimizer_step(cfg, profiles, layout, shards=R if zero == 1 else 1)[:, :, 0]  # (P, R)
    pipeline_end = t.copy()
    t += opt
    stepped = t.copy()
    if zero == 1 and R > 1:
        for j, tensors in enumerate(stage_tensor_bytes(cfg, split, bytes_per_value)):
            t[j] = broadcasts(links, dev[j], t[j], tensors, zero1_owner(tensors, R), conns=conns)
    dp_seconds = float(max((reduce_end[j] - reduce_at[j]).max() for j in reduce_end)) if reduce_end else 0.0
    return float(t.max()), float((M * (fwd + bwd) + opt.T).max()), {"micro_batches": M, "pipeline_seconds": float(pipeline_end.max()),
                            "dp_seconds": dp_seconds, "optimizer_seconds": float(opt.max()),
                            "zero1_broadcast_seconds": float((t - stepped).max())}
