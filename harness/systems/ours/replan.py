"""Re-planning during a run (`harness run --replan`): when the timeline changes the links, ours' scheduler runs
again on the links as they are, and the placement changes at an iteration boundary, each device's new blocks
(weights and SGD momentum) moved to it first.

Who decides, and how every rank knows in time. Rank 0 follows the timeline on its own iteration marks, as the
emulated cluster's controller does (the same Cursor on the same clock: t = 0 when its iteration 0 began, an
iteration event when its iteration ends), so it knows the links as they are without asking anyone. At the end
of its iteration i it re-plans if the links changed, and publishes the plan of iteration i + LEAD in the c10d
store (empty: no change), one key per iteration. LEAD = 3 is the least that needs no collective: a rank posts
iteration n's receives during its iteration n-1, after its data-parallel sync (or its pipeline exchange) of
n-2, which needed a device of rank 0's pipeline to be in n-2, so rank 0 had ended n-3 and written key n. Each
rank reads the keys in a thread of its own, with its own store client, so no iteration waits for a round
trip to rank 0.

The move (`exchange`): a device receives each item (a block, the embedding, the head) its new stage holds and
its old one did not, from the old holder rank 0 chose (harness/sim/replan.move_sources: the fastest link),
one message per source; after the optimizer step every replica holds the same values, so any holder will do.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import replace
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from ...errors import HarnessError
from ...layout import Layout
from ...layout.holdings import item_from_key, item_key, item_of
from ...plan.layouts import resolve_layout, run_topology
from ...plan.request import LayoutRequest, RunRequest, RunSpec
from ...scenario.timeline import LinkState
from ...netmodel.links import Links
from ...sim.replan import REPLAN_LEAD, move_seconds, move_sources
from ...train.rank import progress
from .layout import placement_cost

LEAD = REPLAN_LEAD  # iterations from rank 0's decision to the first iteration on the new plan (module docstring)
KEY = "harness/replan/{}"


class ReplanControl:
    """One rank's side of re-planning: rank 0 decides (`after_iteration`), every rank learns each iteration's
    plan (`plan_for`): None, or (the new Layout, {device: {item: source}})."""

    def __init__(self, rank: int, spec: RunSpec, steps: int, t0: float):
        self.rank, self.spec, self.steps, self.t0 = rank, spec, steps, t0
        self.rows: list[dict] = []  # what this rank did: rank 0's decisions, every rank's moves
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        timeout = timedelta(seconds=spec.run.group_timeout_s)
        self._plans: dict[int, str] = {}
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        if rank == 0:
            self.store = dist.TCPStore(addr, port, is_master=False, timeout=timeout)
            network = replace(spec.network, scenario=spec.resolved.scenario_source)
            self.topo = run_topology(network)
            self.state = LinkState.initial(self.topo)
            self.cursor = self.topo.timeline.cursor()
            self.layout = spec.layout  # the plan in use from the latest decision on
            for n in range(1, min(LEAD, steps)):
                self.store.set(KEY.format(n), "")
        reader = threading.Thread(target=self._read, args=(addr, port, timeout), daemon=True,
                                  name="replan-reader")
        reader.start()

    # -- every rank -----------------------------------------------------------------------------------
    def _read(self, addr: str, port: int, timeout: timedelta) -> None:
        try:
            store = dist.TCPStore(addr, port, is_master=False, timeout=timeout)
            for n in range(1, self.steps):
                value = store.get(KEY.format(n)).decode()
                with self._cond:
                    self._plans[n] = value
                    self._cond.notify_all()
        except BaseException as e:  # the main thread raises it when it needs the plan
            with self._cond:
                self._error = e
                self._cond.notify_all()

    def plan_for(self, n: int) -> tuple[Layout, dict] | None:
        """Iteration n's new plan, or None when it runs on the plan before it."""
        deadline = time.monotonic() + self.spec.run.group_timeout_s
        with self._cond:
            while n not in self._plans:
                if self._error is not None:
                    raise HarnessError(f"--replan: rank {self.rank} could not read the plan of iteration {n}: "
                                       f"{self._error}")
                if not self._cond.wait(max(0.0, deadline - time.monotonic())):
                    raise HarnessError(f"--replan: no plan for iteration {n} within "
                                       f"{self.spec.run.group_timeout_s:g} s")
            value = self._plans[n]
        if not value:
            return None
        doc = json.loads(value)
        sources = {int(d): {item_from_key(k): int(s) for k, s in items.items()} for d, items in doc["sources"].items()}
        return Layout.from_json(doc["layout"]), sources

    # -- rank 0 ---------------------------------------------------------------------------------------
    def after_iteration(self, done: int, now: float) -> None:
        """Rank 0, at the end of iteration `done`: follow the timeline and publish the plan of done + LEAD."""
        if self.rank != 0:
            return
        changes = self.cursor.due(now - self.t0, done + 1)
        for change in changes:
            self.state.apply(change)
        n = done + LEAD
        if n >= self.steps:
            return
        value = self._replan(done, n) if changes else ""
        self.store.set(KEY.format(n), value)

    def _replan(self, done: int, n: int) -> str:
        spec, old = self.spec, self.layout
        topo = self.state.topology(self.topo)
        want = LayoutRequest(pp=old.pp, dp=old.dp, scheduler=spec.replan.scheduler, budget=spec.replan.budget,
                             schedule=old.schedule, dp_sync=old.dp_sync, recompute=old.recompute,
                             allocator=spec.replan.allocator)
        req = RunRequest(network=spec.network, model=spec.model, layout=want, run=spec.run, compute=spec.compute)
        t = time.perf_counter()
        new, _ = resolve_layout(req, topo)
        search_s = time.perf_counter() - t
        cost = lambda lay: placement_cost(topo, lay, spec.cfg, spec.model.batch, spec.model.bytes_per_value)[0]  # noqa: E731
        before, after = cost(old), cost(new)
        same = (new.pipelines, new.stages) == (old.pipelines, old.stages)
        # worth it only if what it saves in the iterations left (the links as they are) pays for its moves
        protocol = "nccl" if spec.run.device_type == "cuda" else "gloo"
        nic = "per-pair" if spec.resolved.backend == "emu" else "shared"
        moves_s = 0.0 if same else move_seconds(old, new, spec.cfg, Links.from_topology(topo, protocol, nic),
                                                spec.model.bytes_per_value)[0]
        saves_s = (before - after) * (self.steps - n)
        taken = not same and after < before * (1.0 - spec.replan.min_gain) and saves_s > moves_s
        self.rows.append({"kind": "decision", "decided_after": done, "iteration": n, "taken": taken,
                          "search_s": round(search_s, 6), "cost_before_s": before, "cost_after_s": after,
                          "saves_s": saves_s, "moves_estimate_s": moves_s,
                          "pipelines": [list(p) for p in new.pipelines], "stages": [list(s) for s in new.stages]})
        progress(f"re-plan after iteration {done + 1}: search {search_s:.2f} s, cost model {before:.3f} -> "
                 f"{after:.3f} s, saves {saves_s:.2f} s in the {self.steps - n} iterations left for "
                 f"{moves_s:.2f} s of moves: " + (f"taken from iteration {n + 1}" if taken else "kept the plan in use"))
        if not taken:
            return ""
        self.layout = new
        rate = np.asarray(topo.bandwidth_gbps)
        sources = move_sources(old, new, rate)
        return json.dumps({"layout": new.to_json(),
                           "sources": {str(d): {item_key(i): s for i, s in items.items()}
                                       for d, items in sources.items()}})


def exchange(held: dict[str, tuple[torch.Tensor, torch.Tensor]], names: list[str], shapes: dict[str, torch.Size],
             sources: dict[int, dict[tuple, int]], me: int, tag: int, device=None) -> tuple[dict, int, int]:
    """Move the items of a re-plan: send what `sources` asks of `me` (from `held`: name -> (value, momentum)),
    receive what it names for `me`, one message per pair. `names`: every parameter name in model order.
    Returns (received name -> (value, momentum), bytes sent, bytes received)."""
    def message_names(items) -> list[str]:
        return [n for n in names if item_of(n) in items]

    works, sent, received, bufs = [], 0, 0, {}
    for dst, items in sorted(sources.items()):
        mine = {item for item, src in items.items() if src == me}
        if dst == me or not mine:
            continue
        flat = torch.cat([t.reshape(-1).float() for n in message_names(mine) for t in held[n]])
        works.append(dist.isend(flat, dst=dst, tag=tag))
        sent += flat.numel() * flat.element_size()
    by_source: dict[int, set] = {}
    for item, src in sources.get(me, {}).items():
        by_source.setdefault(src, set()).add(item)
    for src, items in sorted(by_source.items()):
        wanted = message_names(items)
        buf = torch.empty(sum(2 * shapes[n].numel() for n in wanted), device=device)
        works.append(dist.irecv(buf, src=src, tag=tag))
        bufs[src] = (wanted, buf)
        received += buf.numel() * buf.element_size()
    for w in works:
        w.wait()
    out = {}
    for wanted, buf in bufs.values():
        off = 0
        for n in wanted:
            k = shapes[n].numel()
            out[n] = (buf[off:off + k].view(shapes[n]).clone(), buf[off + k:off + 2 * k].view(shapes[n]).clone())
            off += 2 * k
    return out, sent, received
