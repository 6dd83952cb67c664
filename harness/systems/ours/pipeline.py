"""The system under test ("ours"): pipeline x data parallel GPT training placed by the scheduler.

Each rank runs tasklet t(i, j): stage j of replica i, as given by
`spec.layout` (harness/layout/), with the blocks of the layout's stage range. Replica i trains on samples
[i*B/D_DP, (i+1)*B/D_DP) of the shared synthetic batch, in micro-batches.

The paper's three slots (section 3.5): a receiving slot, a computation slot and
a sending slot run concurrently. Every receive of an iteration (activations from
stage j-1, their gradients from stage j+1) is posted up front as an async irecv
(gloo's transport threads fill them while we compute; on GPU NCCL runs them on
its own streams), and every send is an async isend, so computation waits only
for data that has not arrived yet. Schedules: GPipe (all forwards, then all
backwards, as the paper) or 1F1B. Then the stage's gradients are synchronised in
C_j (dp_sync.py) and every replica takes the same optimizer step.
"""
from __future__ import annotations

import contextlib
import math
import sys
import time

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from ...layout import schedule_order
from ...errors import HarnessError
from .dp_sync import flatten_grads, flatten_values, make_dp_sync, tag, unflatten_into_grads, unflatten_into_values
from .replan import ReplanControl, exchange
from ...train.gpt import GPT, lm_loss, synthetic_batch
from ...train.compute_model import pacer_for
from ...plan.request import RunSpec
from ...train.rank import RankContext, iteration_mark, iteration_progress, progress, torch_dtype
from ...compute import micro_batches
from ...train.reference import make_optimizer
from ...train.stats import IterationStats
from ...train import checkpoint as checkpoints, snapshots, wire

KIND_ACT, KIND_GRAD = 1, 2
KIND_MOVE = 8  # a re-plan's weights (replan.exchange)
ACK = 5 * 10_000  # tag of a message's delivery note: its tag + ACK (kinds 6 and 7, apart from dp_sync's 3 and 4)
FP16_LOSS_SCALE = 1024.0  # static loss scale so fp16 activation gradients do not underflow




class _Clock:
    """Sums compute time; on CUDA with events (no host sync inside the iteration)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.host = 0.0
        self.events: list[tuple] = []

    @contextlib.contextmanager
    def compute(self):
        if self.cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            yield
            b.record()
            self.events.append((a, b))
        else:
            t = time.perf_counter()
            yield
            self.host += time.perf_counter() - t

    def total(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
            return sum(a.elapsed_time(b) for a, b in self.events) / 1e3
        return self.host


class PipelineStageRunner:
    """One tasklet: the stage module, its neighbours, its DP group, and the iteration loop."""

    def __init__(self, ctx: RankContext, spec: RunSpec):
        self.ctx, self.spec = ctx, spec
        L = spec.layout
        if L.devices != ctx.world_size or L.tp != 1:
            raise HarnessError(f"layout: ours runs {L.pp} x {L.dp} stages x replicas without tensor parallelism "
                               f"on {ctx.world_size} ranks (got tp={L.tp})")
        if spec.run.device_type == "cuda" and L.schedule == "1f1b":
            # NCCL runs a pair's sends and receives on one stream in issue order; 1F1B's
            # interleaving needs batched send/recv pairs, which this runtime does not do yet.
            raise HarnessError("layout.schedule: 1f1b is CPU (gloo) only; use gpipe on cuda")
        if not spec.debug.overlap and (spec.run.device_type == "cuda" or L.schedule != "gpipe"):
            # a rendezvous send waits for the peer to take the data: under 1F1B two neighbours can each
            # wait for the other's note; NCCL would order the notes behind the pre-posted receives
            raise HarnessError("debug.overlap=0: GPipe on CPU (gloo) only")
        self.cfg = spec.cfg
        m = spec.model
        self.n_local = micro_batches(m.batch, m.micro_batch, L.dp)
        self.local_batch = m.batch // L.dp
        self.n_total = micro_batches(m.batch, m.micro_batch)
        self.comm_dtype = torch_dtype(spec)
        self.autocast = m.dtype != "fp32"
        self.loss_scale = FP16_LOSS_SCALE if m.dtype == "fp16" else 1.0
        self.act_shape = (m.micro_batch, self.cfg.seq, self.cfg.hidden)
        self.trace = spec.debug.trace  # per-iteration phase times on stderr
        self.send_delay_s, self.overlap = spec.debug.send_delay_s, spec.debug.overlap  # planted regressions
        self._place(L)
        self.snapshots = spec.resolved.snapshots
        if self.snapshots and self.snapshots["recover"]:  # after a preemption: from the survivors' memory
            self._place(L, self._recover(self.snapshots))
        elif spec.resolved.start_iteration:  # resumed: what this stage holds, from the checkpoint, by name
            self._place(L, checkpoints.load(spec.run.resume, spec.resolved.start_iteration, self.param_names))

    def _place(self, L, state: dict | None = None) -> None:
        """Take this rank's tasklet of layout L: its stage's module (the seed's weights, or `state`: name ->
        (value, SGD momentum)), neighbours, data-parallel group, optimizer, schedule and compute model.
        Every rank calls it at once (an all-reduce data-parallel sync makes its groups collectively)."""
        ctx, spec = self.ctx, self.spec
        self.layout = L
        self.stage_idx, self.replica, _ = L.coords(ctx.rank)
        self.first, self.last = self.stage_idx == 0, self.stage_idx == L.pp - 1
        self.prev = L.pipelines[self.replica][self.stage_idx - 1] if not self.first else None
        self.next = L.pipelines[self.replica][self.stage_idx + 1] if not self.last else None
        full = GPT(self.cfg, spec.model.seed)  # identical weights everywhere; keep only this stage
        names = {id(p): n for n, p in full.named_parameters()}
        self.shapes = {n: p.shape for n, p in full.named_parameters()}  # every parameter, in model order
        self.module = full.stage(*L.stages[self.stage_idx]).to(ctx.device)
        self.params = list(self.module.parameters())
        self.numel = sum(p.numel() for p in self.params)
        self.param_names = [names[id(p)] for p in self.module.parameters()]
        del full
        self.opt = make_optimizer(self.params, spec.model.lr)
        if state is not None:
            with torch.no_grad():
                for name, p in zip(self.param_names, self.params):
                    value, momentum = state[name]
                    p.copy_(value)
                    self.opt.state[p]["momentum_buffer"] = momentum.to(device=p.device, dtype=p.dtype).clone()
        self.compressed = not L.compression.off  # CocktailSGD's exchange of parameters (dp_sync.py)
        self.dp = make_dp_sync(L.dp_sync, [L.stage_group(j) for j in range(L.pp)],
                               self.stage_idx, self.replica, L.compression)
        # one order for this runtime and the simulator (harness/layout/schedule_order.py)
        self.order = schedule_order.stage_order(L.schedule, L.pp, self.stage_idx, self.n_local)
        self.next_backward_order = [k for op, k in schedule_order.stage_order(L.schedule, L.pp, self.stage_idx + 1,
                                                                              self.n_local)
                                    if op == "B"]
        self.pacer = pacer_for(spec, self.stage_idx, ctx.device_index, ctx.device)  # the compute model, if on

    def _recover(self, snap: dict) -> dict:
        """The generation after a preemption (train/snapshots.py): what this device held after the plan's
        iteration, and what its new stage lacks from the survivor the agent chose, over the links."""
        plan, t = snap["recover"], time.perf_counter()
        local = snapshots.load(snap["root"], self.ctx.device_index, plan["generation"], plan["iteration"])
        got, sent, received = exchange(local, list(self.shapes), self.shapes,
                                       snapshots.RecoveryPlan.sources_from_json(plan), self.ctx.rank,
                                       tag(plan["iteration"], KIND_MOVE, 0), self.ctx.device)
        self.ctx.mark("state_moved")
        if received or sent:
            progress(f"rank {self.ctx.rank}: recovered after iteration {plan['iteration']}: {received / 1e6:.2f} MB "
                     f"received, {sent / 1e6:.2f} MB sent in {time.perf_counter() - t:.2f} s")
        return {**local, **got}

    def snapshot(self, done: int) -> None:
        """Under the elastic agent: what this device holds after `done` iterations, in its memory."""
        if self.snapshots:
            snapshots.save(self.snapshots["root"], self.ctx.device_index, self.snapshots["generation"], done,
                           self.held())

    def held(self) -> dict:
        """This stage's parameters and their SGD momentum by full GPT name (what a re-plan moves)."""
        out = {}
        for name, p in zip(self.param_names, self.params):
            momentum = self.opt.state.get(p, {}).get("momentum_buffer")
            out[name] = (p.detach(), momentum if momentum is not None else torch.zeros_like(p))
        return out

    def switch(self, L, sources: dict, it: int) -> dict:
        """Re-plan before iteration `it`: receive the items the new stage lacks (replan.exchange), then take
        layout L. Returns what it cost this rank."""
        t = time.perf_counter()
        held = self.held()
        got, sent, received = exchange(held, list(self.shapes), self.shapes, sources, self.ctx.rank,
                                       tag(it, KIND_MOVE, 0), self.ctx.device)
        moved_s = time.perf_counter() - t
        self._place(L, {**held, **got})
        return {"kind": "move", "iteration": it, "rank": self.ctx.rank, "move_s": round(moved_s, 6),
                "rebuild_s": round(time.perf_counter() - t - moved_s, 6), "bytes_sent": sent,
                "bytes_received": received}

    # -- one iteration ---------------------------------------------------------
    def _forward(self, x):
        if self.autocast:
            with torch.autocast(self.ctx.device.type, dtype=self.comm_dtype):
                return self._stage_forward(x)
        return self._stage_forward(x)

    def _stage_forward(self, x):
        if not self.layout.recompute:
            return self.module(x)
        # Keep only block inputs; recompute each block in backward (what the FLOP formula assumes).
        m = self.module
        if m.embed is not None:
            x = m.embed(x)
        for b in m.blocks:
            x = checkpoint(b, x, use_reentrant=False)
        return m.head(x) if m.head is not None else x

    def post_receives(self, it: int) -> dict:
        """The receiving slot: post every receive of iteration `it` (activations, their gradients,
        the DP exchange) so data flows in while we compute. On CUDA only the activations: NCCL
        serialises a pair's operations on one stream in issue order (see iteration())."""
        dev, early = self.ctx.device, self.ctx.device.type != "cuda"
        posted = {"act": {}, "grad": {}, "dp": None}
        for k in range(self.n_local):
            if not self.first:
                buf = torch.empty(self.act_shape, dtype=self.comm_dtype, device=dev)
                posted["act"][k] = (buf, dist.irecv(buf, src=self.prev, tag=tag(it, KIND_ACT, k)))
        if early:
            self._post_grads(it, posted)
            posted["dp"] = self.dp.post(it, self.numel, torch.float32, dev)
        return posted

    def _post_grads(self, it: int, posted: dict) -> None:
        if self.last:
            return
        # In the order the next stage runs its backwards: NCCL ignores tags and matches a
        # pair's messages by order alone.
        for k in self.next_backward_order:
            buf = torch.empty(self.act_shape, dtype=self.comm_dtype, device=self.ctx.device)
            posted["grad"][k] = (buf, dist.irecv(buf, src=self.next, tag=tag(it, KIND_GRAD, k)))

    def _send(self, sends: list, tensor, dst: int, tag_: int) -> None:
        """The sending slot: an async isend, waited at the end of the iteration. The debug section can
        plant a regression: a delay before every send, or no overlap: a rendezvous send, which returns
        only once the peer took the data (its delivery note, `_taken`), so the stage computes nothing
        while its message is in flight. (Waiting on the isend alone would not do: gloo's send completes
        once the data is in the kernel's socket buffer, and the transfer still overlaps.)"""
        if self.send_delay_s:
            time.sleep(self.send_delay_s)
        work = dist.isend(tensor, dst=dst, tag=tag_)
        if self.overlap:
            sends.append(work)
        else:
            work.wait()
            dist.recv(torch.empty(1), src=dst, tag=tag_ + ACK)

    def _taken(self, sends: list, src: int, tag_: int) -> None:
        """Without overlap: tell the sender of message `tag_` that it arrived (see _send)."""
        if not self.overlap:
            sends.append(dist.isend(torch.zeros(1), dst=src, tag=tag_ + ACK))

    def iteration(self, it: int, posted: dict, post_next=None) -> tuple[float, float]:
        """Run iteration `it` on pre-posted receives; calls `post_next()` once this iteration's
        sends are queued (so the next iteration's receives are ready before its data comes).
        Returns (compute seconds, this replica's mean loss or NaN)."""
        spec, dev = self.spec, self.ctx.device
        clock = _Clock(dev)
        lo = self.replica * self.local_batch
        tokens, targets = synthetic_batch(self.cfg, spec.model.batch, it, spec.model.seed, spec.model.data)
        tokens = tokens[lo:lo + self.local_batch].to(dev)
        targets = targets[lo:lo + self.local_batch].to(dev)
        m = spec.model.micro_batch
        act_in, grad_in = posted["act"], posted["grad"]
        sends, saved, losses = [], {}, []
        trace = self.trace
        t_start = time.perf_counter()
        waits = {"act": 0.0, "grad": 0.0}
        for op, k in self.order:
            if op == "F":
                if self.first:
                    x = tokens[k * m:(k + 1) * m]
                else:
                    buf, work = act_in.pop(k)
                    tw = time.perf_counter()
                    work.wait()
                    waits["act"] += time.perf_counter() - tw
                    self._taken(sends, self.prev, tag(it, KIND_ACT, k))
                    x = buf.float().requires_grad_() if self.autocast else buf.requires_grad_()
                with clock.compute(), self.pacer.phase("forward"):
                    y = self._forward(x)
                    if self.last:
                        loss = lm_loss(y, targets[k * m:(k + 1) * m])
                        losses.append(loss.detach())
                        y = loss * (self.loss_scale / self.n_total)
                    else:
                        out = y.detach().to(self.comm_dtype).contiguous()
                if not self.last:
                    self._send(sends, out, self.next, tag(it, KIND_ACT, k))
                    if dev.type == "cuda" and k == self.n_local - 1:
                        # NCCL: gradient receives share the stream of our activation sends to
                        # that peer, so they are posted only after the last of those sends.
                        self._post_grads(it, posted)
                saved[k] = (x, y)
                self.ctx.reached("forward", it)
            else:
                x, y = saved.pop(k)
                if self.last:
                    with clock.compute(), self.pacer.phase("backward"):
                        y.backward()
                else:
                    buf, work = grad_in.pop(k)
                    tw = time.perf_counter()
                    work.wait()
                    waits["grad"] += time.perf_counter() - tw
                    self._taken(sends, self.next, tag(it, KIND_GRAD, k))
                    with clock.compute(), self.pacer.phase("backward"):
                        y.backward(buf.to(y.dtype))
                if not self.first:
                    g = x.grad.to(self.comm_dtype).contiguous()
                    self._send(sends, g, self.prev, tag(it, KIND_GRAD, k))
                self.ctx.reached("backward", it)
        if post_next is not None:
            post_next()
        # Data-parallel sync in C_j, then the same step on every replica (compressed: CocktailSGD's order, each
        # replica's own step, then the replicas' parameters averaged; dp_sync.py).
        t_pipe = time.perf_counter()
        flat = flatten_grads(self.params)
        if not self.compressed:
            flat = self.dp.sync(flat, it, posted["dp"], sent=lambda: self.ctx.reached("dp_sync", it))
        else:
            self.dp.begin(flatten_values(self.params))
            with clock.compute():  # the replica's mean gradient (the loss is over every replica's)
                self._local_step(flat * self.layout.dp)
            averaged = self.dp.average(flatten_values(self.params), it, posted["dp"],
                                       sent=lambda: self.ctx.reached("dp_sync", it))
            with torch.no_grad():
                unflatten_into_values(averaged, self.params)
        t_dp = time.perf_counter()
        for w in sends:
            w.wait()
        if trace:
            print(f"[trace] rank {self.ctx.rank} it {it} stage {self.stage_idx} pipe {t_pipe - t_start:.3f} "
                  f"(wait act {waits['act']:.3f} grad {waits['grad']:.3f}) dp {t_dp - t_pipe:.3f} "
                  f"sends {time.perf_counter() - t_dp:.3f} at {time.time():.3f}", file=sys.stderr, flush=True)
        if not self.compressed:
            with clock.compute():
                self._local_step(flat)
        loss = torch.stack(losses).mean().item() if losses else math.nan
        return clock.total(), loss

    def _local_step(self, flat: torch.Tensor) -> None:
        with self.pacer.phase("optimizer"):
            unflatten_into_grads(flat / self.loss_scale if self.loss_scale != 1.0 else flat, self.params)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)

    def state(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.param_names, self.params))


def train_ours(ctx: RankContext, spec: RunSpec) -> list[IterationStats]:
    runner = PipelineStageRunner(ctx, spec)
    ctx.mark("model")
    warmup, start = spec.run.warmup, spec.resolved.start_iteration
    steps = warmup + spec.run.iters
    posted = {start: runner.post_receives(start)}
    stats = ctx.iteration_log()
    runner.snapshot(start)
    # No start barrier: the pipeline and the DP exchange synchronise the ranks; the first
    # (warm-up) iterations absorb connection set-up.
    ctx.mark("training")
    t_prev = time.monotonic()  # one clock for every rank of a host (runner.merge_stats)
    control = ReplanControl(ctx.rank, spec, steps, t_prev) if spec.replan.enabled else None
    for it in range(start, steps):
        def post_next(nxt=it + 1):
            # a re-planned iteration's receives are posted once its plan is in place (below)
            if nxt < steps and (control is None or control.plan_for(nxt) is None):
                posted[nxt] = runner.post_receives(nxt)

        compute, loss = runner.iteration(it, posted.pop(it), post_next)
        runner.snapshot(it + 1)  # in the iteration's time: what recovering from memory costs
        t = time.monotonic()
        if it == start:
            ctx.mark("first_iteration")
        if it >= warmup:
            stats.append(IterationStats(seconds=t - t_prev, compute_seconds=compute,
                                        exposed_comm_seconds=max(0.0, t - t_prev - compute), loss=loss, end=t,
                                        **runner.pacer.take_iteration(), **wire.take_iteration()))
        else:
            runner.pacer.take()  # warm-up overruns and bytes are not the timed iterations'
            wire.take_iteration()
        every = spec.run.checkpoint_every
        if every and (it + 1) % every == 0:  # after the iteration's update: what it holds now
            ctx.reached("checkpoint", it)
            checkpoints.save(spec.resolved.checkpoint_dir, it + 1, ctx.rank, ctx.world_size, runner.held())
            # the next iteration's time does not include the write; it begins after it (so a checkpoint is
            # complete when the last rank marks the next iteration: an agent that stops the run then has it)
            t = time.monotonic()
        # every rank marks: a timeline's iteration event fires where the records' boundary is, the last rank's end
        iteration_mark(it, t - t_prev, ctx.world_size)
        if ctx.rank == 0:
            iteration_progress(it, steps, warmup, t - t_prev, mark=False)
        if control is not None:  # a re-plan's search and moves count in the iteration after them
            control.after_iteration(it, t)
            if it + 1 < steps and (plan := control.plan_for(it + 1)) is not None:
                control.rows.append(runner.switch(*plan, it + 1))
                posted[it + 1] = runner.post_receives(it + 1)
        t_prev = t
    if control is not None and stats:
        stats[-1].replans = control.rows
    ctx.save_state(runner.state())
    return stats
