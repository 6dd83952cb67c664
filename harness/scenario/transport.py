"""TCP settings of every device's kernel, as a scenario states them (`transport:`).

They belong to the scenario because they decide how long a message takes on a long, fast link as much
as the shaped rate does: a window of Linux's default buffers covers 3 MB, a few percent of a 1 Gbps x
135 ms path; a connection idle for longer than its retransmission timeout restarts slow start
(`tcp_slow_start_after_idle`), so a pipeline's bursty sends pay round trips again.

Defaults are Linux's (6.1, also the user-mode kernel's): slow start after idle on, tcp_rmem max 6 MiB,
tcp_wmem max 4 MiB, and the kernel's own congestion control, left as it is (CUBIC in Linux and in the
user-mode kernel; a host may default to another: a namespace may only take one of the host's
net.ipv4.tcp_allowed_congestion_control, so one is set only where a scenario names it). A buffer given as `auto` is sized from the scenario's links instead:
4 round-trip bandwidth-delay products of its fastest, farthest shaped link (at least Linux's default,
at most 256 MiB), room for the window to fill any of its links (what the harness did before
`transport:` existed). The network layer applies the settings inside every device's namespace
(harness/network/apply.py); the simulator's transport model reads the same values
(harness/netmodel/tcp.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

CONGESTION_CONTROLS = ("cubic", "reno", "bbr")
#: Linux's net.ipv4.tcp_rmem / tcp_wmem (min, default, max) in bytes.
LINUX_RMEM = (4096, 131072, 6291456)
LINUX_WMEM = (4096, 16384, 4194304)
AUTO = "auto"
AUTO_BDP_FACTOR = 4
AUTO_MAX_BYTES = 256 * 1024 * 1024
KEYS = {"congestion_control", "slow_start_after_idle", "rmem_max_bytes", "wmem_max_bytes"}


@dataclass(frozen=True)
class Transport:
    congestion_control: str | None = None  # None: the kernel's own
    slow_start_after_idle: bool = True
    rmem_max_bytes: int | str = LINUX_RMEM[2]  # or AUTO
    wmem_max_bytes: int | str = LINUX_WMEM[2]

    def resolved(self, largest_bdp_bytes: float) -> "Transport":
        """The same settings with `auto` buffers turned into bytes for links whose largest round-trip
        bandwidth-delay product is `largest_bdp_bytes`."""
        auto = int(min(AUTO_MAX_BYTES, max(LINUX_RMEM[2], AUTO_BDP_FACTOR * largest_bdp_bytes)))
        return Transport(self.congestion_control, self.slow_start_after_idle,
                         auto if self.rmem_max_bytes == AUTO else int(self.rmem_max_bytes),
                         auto if self.wmem_max_bytes == AUTO else int(self.wmem_max_bytes))

    def sysctls(self) -> dict[str, str]:
        """net.ipv4 settings (per network namespace in Linux >= 4.15) of resolved settings, as /proc/sys
        writes them."""
        if AUTO in (self.rmem_max_bytes, self.wmem_max_bytes):
            raise ValueError("resolve `auto` buffers first (Transport.resolved)")
        out = {"tcp_congestion_control": self.congestion_control} if self.congestion_control else {}
        return {**out,
                "tcp_slow_start_after_idle": str(int(self.slow_start_after_idle)),
                "tcp_rmem": f"{LINUX_RMEM[0]} {LINUX_RMEM[1]} {self.rmem_max_bytes}",
                "tcp_wmem": f"{LINUX_WMEM[0]} {LINUX_WMEM[1]} {self.wmem_max_bytes}"}

    def to_json(self) -> dict:
        return asdict(self)


LINUX = Transport()
#: named settings a command may put in place of the scenario's (`--transport`)
PRESETS = {"linux": LINUX, "tuned": Transport(None, False, AUTO, AUTO)}


def with_preset(topo, name: str):
    """`topo` (a Topology) with the preset `name` in place of its TCP settings; `scenario`: as it is."""
    return topo if name == "scenario" else replace(topo, transport=PRESETS[name])
#: what a namespace's settings are read back as (the congestion control in force also where none is set)
SYSCTL_NAMES = ("tcp_congestion_control", "tcp_slow_start_after_idle", "tcp_rmem", "tcp_wmem")
