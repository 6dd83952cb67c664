"""What each device of a layout holds of the model, and where a device that must hold more gets it from: the
items a re-plan (systems/ours/replan.py, sim/replan.py) or a recovery from the survivors' memory
(train/snapshots.py) moves. An item is a transformer block ("block", i), the embedding ("embedding",) or the
head ("head",); the replicas of a stage hold the same values after every optimizer step, so any holder will do.
"""
from __future__ import annotations

from . import Layout


def holdings(layout: Layout) -> dict[int, set]:
    """What each device holds: ("block", i) of its stage's range, ("embedding",) on stage 0, ("head",) on the
    last stage."""
    out: dict[int, set] = {}
    for pipe in layout.replica_pipelines():
        last = len(pipe.devices) - 1
        for j, (d, (a, b)) in enumerate(zip(pipe.devices, pipe.stages)):
            held = {("block", i) for i in range(a, b)}
            held |= {("embedding",)} if j == 0 else set()
            held |= {("head",)} if j == last else set()
            out.setdefault(d, set()).update(held)
    return out


def sources_of(had: dict[int, set], has: dict[int, set], rate) -> dict[int, dict[tuple, int]]:
    """What each device must receive: {device: {item: source}}, an item of `has[device]` not in `had[device]`,
    from the holder (in `had`) with the fastest link to it (`rate[source, device]`, any unit). Raises KeyError
    for an item nobody holds."""
    holders: dict[tuple, list[int]] = {}
    for d in sorted(had):
        for item in sorted(had[d]):
            holders.setdefault(item, []).append(d)
    return {d: {item: max(holders[item], key=lambda s: rate[s, d]) for item in sorted(items - had.get(d, set()))}
            for d, items in sorted(has.items()) if items - had.get(d, set())}


def item_of(name: str) -> tuple:
    """The item a GPT parameter name belongs to."""
    part = name.split(".")
    if part[0] == "blocks":
        return ("block", int(part[1]))
    return {"embed": ("embedding",), "head": ("head",)}[part[0]]


def item_key(item: tuple) -> str:
    """An item as text (JSON keys): "block:3", "embedding"."""
    return ":".join(map(str, item))


def item_from_key(key: str) -> tuple:
    kind, _, index = key.partition(":")
    return (kind, int(index)) if index else (kind,)
