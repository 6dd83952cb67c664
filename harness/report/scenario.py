"""Human views of a Topology: a text summary and delay/bandwidth heatmaps (paper Fig. 3 a-b)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..compute.profiles import default_profile
from ..scenario import Topology
from ..plots.figures import save_figure


def scenario_summary(topo: Topology) -> str:
    off = ~np.eye(topo.n, dtype=bool)
    d, b = topo.delay_ms[off], topo.bandwidth_gbps[off]
    lines = [
        f"scenario {topo.name}: {topo.description}",
        f"  file: {topo.source}",
        f"  {topo.n} devices in {len(topo.regions)} regions; one-way delay {d.min():g}-{d.max():g} ms, "
        f"bandwidth {b.min():g}-{b.max():g} Gbps" + (" (asymmetric)" if not np.allclose(
            topo.bandwidth_gbps[off], topo.bandwidth_gbps.T[off]) or not np.allclose(topo.delay_ms, topo.delay_ms.T)
            else ""),
        f"  {'region':16s} {'devices':>7s} {'ids':>9s} {'intra delay ms':>14s} {'intra Gbps':>10s}  "
        "device (type, memory, effective fp16 TFLOPS = peak x efficiency / slowdown)",
    ]
    start = 0
    for r in topo.regions:
        ids = f"{start}-{start + r.devices - 1}" if r.devices > 1 else str(start)
        p, c = r.profile, default_profile(r.profile)
        eff = c.efficiency["transformer"]
        slow = f" / {p.slowdown:g}" if p.slowdown != 1 else ""
        lines.append(
            f"  {r.name:16s} {r.devices:7d} {ids:>9s} {r.intra.delay_ms:14g} {r.intra.bandwidth_gbps:10g}  "
            f"{p.gpu}, {p.memory_gb:g} GB, {c.flops_per_s('transformer') / 1e12:.3g} TFLOPS "
            f"({p.peak_tflops:g} x {eff:g}{slow})"
        )
        start += r.devices
    return "\n".join(lines)


def write_heatmaps(topo: Topology, out_dir: Path) -> list[Path]:
    """delay.png and bandwidth.png: device x device, sender on rows."""
    import matplotlib.pyplot as plt

    paths = []
    for key, matrix, label, cmap in (
        ("delay", topo.delay_ms, "one-way delay (ms)", "viridis"),
        ("bandwidth", np.where(np.isinf(topo.bandwidth_gbps), np.nan, topo.bandwidth_gbps), "bandwidth (Gbps)",
         "magma"),
    ):
        fig, ax = plt.subplots(figsize=(5.2, 4.4))
        im = ax.imshow(matrix, cmap=cmap, interpolation="nearest")
        ax.set_title(f"{topo.name}: {label}")
        ax.set_xlabel("receiver device")
        ax.set_ylabel("sender device")
        fig.colorbar(im, ax=ax, shrink=0.85)
        paths.append(save_figure(fig, Path(out_dir) / f"{key}.png"))
        plt.close(fig)
    return paths
