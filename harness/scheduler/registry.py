"""The schedulers by name: each search registers itself here (`@register`), and the package looks it up.

Its own module, below the searches and the package, so that a search's registration imports nothing that
imports it back.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..errors import HarnessError
from .cost import CostModel
from .search import SearchResult


class SchedulerError(HarnessError, ValueError):
    """Unknown scheduler, bad budget, or an instance a scheduler cannot handle."""


SCHEDULERS: dict[str, Callable[[CostModel, np.random.Generator, int], SearchResult]] = {}
COMPUTE_AWARE: set[str] = set()  # schedulers whose objective is the modelled iteration time
COMPUTE_AWARE_ALLOCATOR = "optimal"  # the allocator their objective takes each candidate's stages from


def register(name: str, compute_aware: bool = False):
    def deco(fn):
        SCHEDULERS[name] = fn
        if compute_aware:
            COMPUTE_AWARE.add(name)
        return fn

    return deco
