"""Figure plumbing shared by every report: headless backend, atomic PNG writes."""
from __future__ import annotations

from pathlib import Path

import matplotlib

from ..files import atomic_path

matplotlib.use("Agg")


def save_figure(fig, path: Path, dpi: int = 120) -> Path:
    """Save `fig` as PNG at `path` atomically (temporary file + rename)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
    return Path(path)
