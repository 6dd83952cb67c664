"""Human views of a Topology: a text summary and delay/bandwidth heatmaps (paper Fig. 3 a-b)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..compute.profiles import default_profile
from ..scenario import Topology
from ..plots.figures import save_figure


def _pair_links(topo: Topology) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(delay, bandwidth, their transposes) over every ordered pair of distinct devices, by region where the
    links are the regions' (one value per region pair that has such a pair: no N x N matrix)."""
    if topo.region_links is not None:
        delay, bw = topo.region_links
        sizes = np.array([r.devices for r in topo.regions])
        used = ~np.eye(len(sizes), dtype=bool) | (sizes > 1)[:, None]
        return delay[used], bw[used], delay.T[used], bw.T[used]
    off = ~np.eye(topo.n, dtype=bool)
    return topo.delay_ms[off], topo.bandwidth_gbps[off], topo.delay_ms.T[off], topo.bandwidth_gbps.T[off]


def scenario_summary(topo: Topology) -> str:
    d, b, d_t, b_t = _pair_links(topo)
    lines = [
        f"scenario {topo.name}: {topo.description}",
        f"  file: {topo.source}",
        f"  {topo.n} devices in {len(topo.regions)} regions; one-way delay {d.min():g}-{d.max():g} ms, "
        f"bandwidth {b.min():g}-{b.max():g} Gbps" + (" (asymmetric)" if not np.allclose(b, b_t)
                                                     or not np.allclose(d, d_t) else ""),
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


HEATMAP_DEVICES_MAX = 1024  # beyond, the heatmaps are region x region (a device x device one is 839 MB at 10,240)


def write_heatmaps(topo: Topology, out_dir: Path) -> list[Path]:
    """delay.png and bandwidth.png: device x device, sender on rows (region x region beyond
    HEATMAP_DEVICES_MAX devices where the links are the regions')."""
    import matplotlib.pyplot as plt

    by_region = topo.n > HEATMAP_DEVICES_MAX and topo.region_links is not None
    delay, bw = topo.region_links if by_region else (topo.delay_ms, topo.bandwidth_gbps)
    unit = "region" if by_region else "device"
    paths = []
    for key, matrix, label, cmap in (
        ("delay", delay, "one-way delay (ms)", "viridis"),
        ("bandwidth", np.where(np.isinf(bw), np.nan, bw), "bandwidth (Gbps)", "magma"),
    ):
        fig, ax = plt.subplots(figsize=(5.2, 4.4))
        im = ax.imshow(matrix, cmap=cmap, interpolation="nearest")
        ax.set_title(f"{topo.name}: {label}")
        ax.set_xlabel(f"receiver {unit}")
        ax.set_ylabel(f"sender {unit}")
        fig.colorbar(im, ax=ax, shrink=0.85)
        paths.append(save_figure(fig, Path(out_dir) / f"{key}.png"))
        plt.close(fig)
    return paths
