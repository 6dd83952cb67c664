"""Which kernel runs the emulated cluster: the host's, or a user-mode Linux kernel.

netem is what makes a link slow *and far*; many cloud/CI kernels are built without
sch_netem. `choose("auto")` takes the host kernel when it offers sch_netem and HTB
(and we may create namespaces: root), else user-mode Linux (Debian `user-mode-linux`,
a 6.1 kernel that ships sch_netem as a module and runs as a process), else raises one
clear error. `--kernel host|uml` forces either; every result records which one ran.
"""
from __future__ import annotations

import gzip
import os
import platform
import shutil
from pathlib import Path

from ..errors import HarnessError

KERNELS = ("auto", "host", "uml")
UML_BINARY = "linux.uml"
UML_MODULES = Path("/usr/lib/uml/modules")
NEEDED = ("NET_SCH_NETEM", "NET_SCH_HTB", "NET_CLS_U32", "VETH", "BRIDGE", "NET_NS")


class KernelError(HarnessError, RuntimeError):
    """No kernel able to run the emulated cluster (one line saying what is missing)."""


def _host_config() -> dict[str, str] | None:
    rel = platform.release()
    for path in (Path("/proc/config.gz"), Path(f"/boot/config-{rel}")):
        try:
            raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        except OSError:
            continue
        conf = {}
        for line in raw.decode(errors="replace").splitlines():
            if line.startswith("CONFIG_") and "=" in line:
                k, v = line[7:].split("=", 1)
                conf[k] = v
        return conf
    return None


def _module_file(name: str) -> bool:
    base = Path("/lib/modules") / platform.release()
    return base.is_dir() and any(base.rglob(f"{name}.ko*"))


def host_missing() -> list[str]:
    """What the host kernel lacks for the cluster (empty: usable). Root is needed too."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (CAP_NET_ADMIN)")
    conf = _host_config()
    if conf is None:
        if not Path("/sys/module/sch_netem").exists() and not _module_file("sch_netem"):
            missing.append("CONFIG_NET_SCH_NETEM (no kernel config to read, no sch_netem module)")
        return missing
    mods = {"NET_SCH_NETEM": "sch_netem", "NET_SCH_HTB": "sch_htb", "NET_CLS_U32": "cls_u32",
            "VETH": "veth", "BRIDGE": "bridge", "NET_NS": ""}
    for opt in NEEDED:
        v = conf.get(opt)
        if v == "y" or (v == "m" and mods[opt] and _module_file(mods[opt])):
            continue
        missing.append(f"CONFIG_{opt}")
    return missing


def uml_missing() -> list[str]:
    missing = []
    if shutil.which(UML_BINARY) is None:
        missing.append(f"{UML_BINARY} (apt-get install user-mode-linux)")
    if not UML_MODULES.is_dir() or not any(UML_MODULES.glob("*/kernel")):
        missing.append(f"{UML_MODULES} (apt-get install user-mode-linux)")
    if shutil.which("modprobe") is None:
        missing.append("modprobe (apt-get install kmod)")
    return missing


def choose(kernel: str = "auto") -> str:
    """'host' or 'uml' for the requested `kernel`; raises KernelError with what is missing."""
    if kernel not in KERNELS:
        raise KernelError(f"--kernel: must be one of {', '.join(KERNELS)} (got {kernel!r})")
    if kernel in ("auto", "host"):
        hm = host_missing()
        if not hm:
            return "host"
        if kernel == "host":
            raise KernelError(f"--kernel host: this kernel ({platform.release()}) lacks {', '.join(hm)}; "
                              "use --kernel uml")
    um = uml_missing()
    if not um:
        return "uml"
    if kernel == "uml":
        raise KernelError(f"--kernel uml: missing {', '.join(um)}")
    raise KernelError(f"no kernel with netem: host kernel lacks {', '.join(host_missing())}; "
                      f"user-mode Linux missing {', '.join(um)}")
