"""Transfer curves (`net verify --transfer-curves`): measured points beside the transport model's prediction
of each (netmodel/tcp.py) with the error, and one plot per idle time (time against size per link class,
log-log)."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt

import numpy as np

from ..netmodel.tcp import HOST_HZ, UML_HZ, TcpPath
from ..files import atomic_write_text
from ..plots.figures import save_figure
from ..scenario.transport import Transport
from ..units import ms_to_s


def modelled_seconds(doc: dict) -> np.ndarray:
    """The transport model's time for every measured point of a transfer-curves document (to_json of
    network/curves.py): the emulated link as the plan built it (its HTB bucket), the kernel's clock tick,
    the idle time each message actually had."""
    pts = doc["points"]
    col = lambda k: np.array([p[k] for p in pts], dtype=float)  # noqa: E731
    eff = doc["tcp_efficiency"]
    path = TcpPath.of(col("rate_mbps") * 1e6 / 8 * eff, ms_to_s(col("delay_ms")), ms_to_s(col("rtt_ms")),
                      Transport(**doc["transport"]), mtu=doc["mtu"], bucket_bytes=col("burst_bytes") * eff,
                      hz=UML_HZ if doc["kernel"] == "uml" else HOST_HZ)
    return path.message_seconds(col("bytes"), col("idle_measured_s"))


def side_by_side(doc: dict) -> str:
    """Measured against modelled, one line per point, and a summary line."""
    model = modelled_seconds(doc)
    lines = [f"{'pair':>7} {'rate':>11} {'RTT':>8} {'bytes':>10} {'idle':>5} {'measured':>9} {'model':>9} "
             f"{'error':>7}"]
    errs = []
    for p, m in zip(doc["points"], model):
        err = (m / p["seconds"] - 1) * 100
        errs.append(abs(err))
        lines.append(f"{p['src']:>3}->{p['dst']:<3} {p['rate_mbps']:>6.1f}Mb/s {p['rtt_ms']:>6.1f}ms {p['bytes']:>10} "
                     f"{p['idle_s']:>4.1f}s {p['seconds']:>8.4f}s {m:>8.4f}s {err:>6.1f}%")
    errs = np.array(errs)
    lines.append(f"{len(errs)} points ({doc['scenario']}, bandwidth scale {doc['bandwidth_scale']:g}, kernel "
                 f"{doc['kernel']}, {Transport(**doc['transport'])}): median |error| {np.median(errs):.2f} %, "
                 f"{(errs <= 5).sum()} within 5 %, worst {errs.max():.1f} %")
    return "\n".join(lines)


def write_transfer_report(rep, out_dir: Path) -> list[Path]:
    """CSV + JSON of the points (network/curves.py), measured beside modelled (table), and the plot."""
    out_dir = Path(out_dir)
    paths = rep.write(out_dir)
    doc = rep.to_json()
    table = out_dir / "transfer-curves.txt"
    text = side_by_side(doc)
    atomic_write_text(table, text + "\n")
    print(text)
    return paths + [table, save_figure(_figure(doc["points"], modelled_seconds(doc)), out_dir / "transfer-curves.png")]


def _figure(rows: list[dict], model: np.ndarray):
    idles = sorted({r["idle_s"] for r in rows})
    fig, axes = plt.subplots(1, len(idles), figsize=(5.5 * len(idles), 4.2), squeeze=False)
    pairs = sorted({(r["src"], r["dst"]) for r in rows})
    for ax, idle in zip(axes[0], idles):
        for k, (s, d) in enumerate(pairs):
            pts = sorted((r["bytes"], r["seconds"], m, r["rep"]) for r, m in zip(rows, model)
                         if (r["src"], r["dst"]) == (s, d) and r["idle_s"] == idle)
            if not pts:
                continue
            r0 = next(r for r in rows if (r["src"], r["dst"]) == (s, d))
            colour = f"C{k % 10}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", color=colour, ms=4,
                    label=f"{s}->{d}: {r0['rate_mbps']:.0f} Mbit/s, {r0['rtt_ms']:.0f} ms")
            sizes = sorted({p[0] for p in pts})
            modelled = {p[0]: p[2] for p in pts if p[3] == 0}
            ax.plot(sizes, [modelled[b] for b in sizes], "-", color=colour, lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("transfer time (s)")
        ax.set_title(f"idle {idle:g} s before the message (dots: measured, lines: transport model)", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig
