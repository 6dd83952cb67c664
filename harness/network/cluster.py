"""The local emulated cluster in the *current* kernel: namespaces, veths, a bridge, shaping.

`with Cluster(topo, ...) as c:` creates one namespace per device (dedicated prefix,
dedicated private subnet), one veth each into a bridge, applies the shaping plan
and reads it back; leaving the block (normally, by exception or by a signal turned
into an exception) removes exactly what was created. The run's registry entry is
written before anything is created, so `harness net clean` can finish the job after
a SIGKILL. Runs inside the host kernel, or inside user-mode Linux (see uml.py).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from pyroute2 import IPRoute
from tqdm import tqdm

from . import netns as harness_netns
from . import registry
from .apply import ShapingError, apply_device, compare, readback, set_transport
from .plan import NetworkPlan, build_plan, device_addresses, transport_sysctls

SUBNET = "10.213.0.0/16"
NETNS_DIR = "/var/run/netns"


@dataclass(frozen=True)
class Device:
    index: int
    netns: str
    netns_path: str
    ifname: str
    addr: str


class Cluster:
    def __init__(self, topo, *, run_id: str | None = None,
                 subnet: str = SUBNET, jitter_ms: float = 0.0, loss_pct: float = 0.0,
                 progress: bool = False):
        self.run_id = run_id or registry.new_run_id()
        rid = self.run_id
        addrs, prefix = device_addresses(topo.n, subnet)
        ifnames = [registry.device_ifname(rid, i) for i in range(topo.n)]
        # Built (and validated) before anything touches the kernel.
        self.plan: NetworkPlan = build_plan(topo, addrs, ifnames, prefix_len=prefix, jitter_ms=jitter_ms,
                                            loss_pct=loss_pct)
        self.devices = [
            Device(i, registry.netns_name(rid, i), f"{NETNS_DIR}/{registry.netns_name(rid, i)}",
                   ifnames[i], addrs[i])
            for i in range(topo.n)
        ]
        self.bridge = registry.bridge_name(rid)
        self.readback: dict = {}
        self.progress = progress
        self._entry = registry.Entry(
            run_id=rid, pid=os.getpid(), kind="cluster",
            netns=[d.netns for d in self.devices],
            links=[self.bridge] + [registry.host_veth_name(rid, i) for i in range(topo.n)],
        )

    # -- lifecycle -------------------------------------------------------------
    def __enter__(self) -> "Cluster":
        self._entry.save()
        try:
            self._create()
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def teardown(self) -> None:
        registry.teardown(self._entry)

    # -- steps -----------------------------------------------------------------
    def _create(self) -> None:
        """Namespaces, veths into the bridge, addresses, TCP settings, then the shaping (with one
        netlink socket per namespace, opened from inside it: no helper processes)."""
        rid = self.run_id
        sysctls = transport_sysctls(self.plan)
        problems = []
        bar = tqdm(total=len(self.devices), desc="namespaces + shaping", disable=not self.progress, leave=False)
        with IPRoute() as ipr:
            ipr.link("add", ifname=self.bridge, kind="bridge")
            br = ipr.link_lookup(ifname=self.bridge)[0]
            ipr.link("set", index=br, state="up")
            for dev, dplan in zip(self.devices, self.plan.devices):
                harness_netns.create(dev.netns_path)
                host_if = registry.host_veth_name(rid, dev.index)
                ipr.link("add", ifname=host_if, kind="veth",
                         peer={"ifname": dev.ifname, "gso_max_segs": dplan.gso_max_segs})
                h = ipr.link_lookup(ifname=host_if)[0]
                p = ipr.link_lookup(ifname=dev.ifname)[0]
                ipr.link("set", index=p, net_ns_fd=dev.netns)
                ipr.link("set", index=h, master=br, state="up")
                with harness_netns.inside(dev.netns_path):
                    transport = set_transport(sysctls)
                    with IPRoute() as nsr:
                        i = nsr.link_lookup(ifname=dev.ifname)[0]
                        nsr.addr("add", index=i, address=dev.addr, prefixlen=self.plan.prefix_len)
                        nsr.link("set", index=i, state="up")
                        nsr.link("set", index=nsr.link_lookup(ifname="lo")[0], state="up")
                        apply_device(nsr, i, dplan, fresh=True)
                        rb = readback(nsr, i)
                problems += compare(dplan, rb)
                self.readback[str(dev.index)] = {**rb, "transport": transport}
                bar.update()
        bar.close()
        if problems:
            raise ShapingError(f"kernel state differs from the plan: {problems[0]} ({len(problems)} differences)")

    def describe(self, kernel: str) -> dict:
        """The HARNESS_CLUSTER document for launcher-mode programs."""
        return {
            "kernel": kernel,
            "run_id": self.run_id,
            "bandwidth_scale": self.plan.bandwidth_scale,
            "devices": [vars(d) for d in self.devices],
            "readback": self.readback,  # the shaping as the kernel holds it; each run's manifest keeps it
        }

