"""Network emulation: the links between device processes behave like the scenario says.

plan.py      Topology -> per-device egress plan (HTB class + netem + u32 per destination); tc rendering
apply.py     the plan through netlink (pyroute2): apply, read back, compare, remove
netns.py     create/enter network namespaces without forking (launcher children call enter())
cluster.py   the local emulated cluster in the current kernel (namespaces, veths, bridge, shaping)
kernel.py    host kernel with sch_netem, or user-mode Linux, or one clear error
uml.py       boot a user-mode Linux kernel on a job (hostfs), carry results back
runner.py    run a command per device / once (launcher) in a cluster of the current kernel
guest.py     entry point inside UML
emulate.py   run_emulated(): the launcher used by trainers, baselines and `harness emulate`
registry.py  what each run created; `net clean` / `net show`
reaper.py    one process per run that tears it down (as `net clean`) once its harness process is gone
probe.py     in-cluster RTT + goodput measurements; verify.py: targets, pass rules, report
node.py      real nodes: macvlan namespaces per GPU process from the inventory (`net apply|clear`), a rank's network
dryrun.py    the local cluster as ip/tc commands
"""
