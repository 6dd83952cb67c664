# Two entry points for people: `make scenario-5` (the main job) and `make test`.
# Both work on a fresh Debian machine: they create .venv, install the Python
# packages (torch pinned to the CPU build 2.13.0) and, as root, the Debian
# packages the emulated cluster needs (user-mode-linux when the host kernel has no
# sch_netem).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
HARNESS := $(VENV)/bin/harness
STAMP  := $(VENV)/.installed

.PHONY: all venv system-deps test soak bench regress clean net-clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

venv: $(STAMP)

# iproute2 + kmod for namespaces and modules; user-mode-linux boots a 6.1 kernel with
# sch_netem as a process when the host kernel lacks it (see harness/network/kernel.py);
# gcc builds the small register-state shim UML needs on CPUs with AVX-512/AMX
# (harness/network/uml_xstate_shim.c); slurmd, slurmctld, slurm-client and munge run the
# one-node Slurm of tests/test_cluster_slurm.py (started by the test, not as services).
SYSTEM_PACKAGES := user-mode-linux kmod iproute2 gcc libc6-dev slurmd slurmctld slurm-client munge
system-deps:
	@if command -v linux.uml >/dev/null && command -v ip >/dev/null && command -v modprobe >/dev/null \
	    && command -v cc >/dev/null && command -v slurmd >/dev/null && command -v slurmctld >/dev/null \
	    && command -v sbatch >/dev/null && command -v munged >/dev/null; then \
	  echo "system packages present ($(SYSTEM_PACKAGES))"; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES) >/dev/null; \
	else \
	  echo "system-deps: run as root (apt-get install $(SYSTEM_PACKAGES))"; exit 1; \
	fi

# two pytest-xdist workers; tests of machine-wide state (marked net or machine) run on one of them, one at a time;
# at the end the 15 slowest tests, the seconds of each file and a total per group (unit, emulated, Slurm)
TEST_JOBS ?= 2
test: $(STAMP) system-deps
	$(PY) -m pytest tests --ignore=tests/bench --ignore=tests/soak -q -n $(TEST_JOBS) --dist loadgroup --durations=15

# Soaks: what `make test` proves once, repeated at moments no one chose or waited for as Slurm counts (tests/soak/;
# not in CI). Run once after a change to what they name in their docstrings (the kill soak: reaper, registry,
# teardown, the launch gate; the time-limit soak: the sbatch script's trap).
soak: $(STAMP) system-deps
	$(PY) -m pytest tests/soak -q -s --durations=5

# The throughput regression gate against the committed baseline (tests/regress/baseline.json):
# exact figures and emulated case-5 runs (about 7 min); QUICK=1: the exact figures only (seconds),
# what CI runs after the tests. Renew the baseline on purpose: $(HARNESS) regress --update-baseline
regress: $(STAMP) system-deps
	$(HARNESS) regress $(if $(QUICK),--quick)

bench: $(STAMP) system-deps
	$(PY) -m pytest tests/bench --benchmark-only --benchmark-columns=min,median,max,rounds -q

# Every case of the paper from one rule: `make scenario-N` (N = 1 ... 5, fluidstack) writes to
# results/<case>/ (e.g. results/5-worldwide/). Paper scale (simulated): scenario heatmaps, the GA
# assignment, the scheduler comparison (Fig. 4) and the simulator. Emulated (measured): 8 devices
# (the scaled-down case; each scenario file says how its 8 were chosen), tiny GPT, links at 1/100
# of the paper's bandwidth so communication dominates as in the paper, each device's compute its
# GPU's modelled time (--compute-model), time dilated as a probe of this host calls for: ours,
# ours-random (the paper's seeds) and the baselines; then the simulator's prediction for each run
# (from the same compute model: nothing fitted on the runs it is compared with), one table + PFLOPS
# plots of all runs, and report.md over all of it, the paper's ratios beside the measured ones.
# The emulated runs share one boot of the cluster (one set of imports and warm-up; each run forks
# fresh ranks).
# QUICK=1: the same outputs from fewer repetitions and iterations, into results/<case>/quick/.
SCENARIO_CASES := 1 2 3 4 5 fluidstack
CASE_NAME = $(basename $(notdir $(firstword $(wildcard scenarios/$*-*.yaml scenarios/$*.yaml))))
CASE_OUT  = $(or $(SCENARIO_OUT),results/$(CASE_NAME)$(if $(QUICK),/quick))
EMU       = --scenario $* --devices 8 --model tiny --layers 4 --batch 8 --micro-batch 1 --bandwidth-scale 0.01 --compute-model \
            $(if $(QUICK),--iters 1 --warmup 1,--iters 3 --warmup 3) --results $(CASE_OUT)/emu
RANDOM_SEEDS = $(if $(QUICK),2022,2022 2023 2024)
MEGATRON  = --system megatron --tp 1 --pp 4 --dp 2
# every emulated run of the case in one boot of the cluster (harness run --each), one after another
EACH      = --each '--system ours' $(foreach s,$(RANDOM_SEEDS),--each '--system ours-random --seed $(s)') \
            --each '$(MEGATRON)' $(if $(QUICK),,--each '$(MEGATRON) --rank-order 2022') \
            --each '--system deepspeed --zero 1 --pp 4 --dp 2'
SEARCH    = $(if $(QUICK),--budget 2000)
.PHONY: $(addprefix scenario-,$(SCENARIO_CASES))
$(addprefix scenario-,$(SCENARIO_CASES)): scenario-%: $(STAMP) system-deps
	$(HARNESS) scenario show $* --out $(CASE_OUT)/scenario
	$(HARNESS) scenario show $* --devices 8 --out $(CASE_OUT)/scenario-8
	$(HARNESS) schedule --scenario $* --scheduler ga $(SEARCH) --json $(CASE_OUT)/schedule-ga.json
	$(HARNESS) schedule compare --scenario $* $(SEARCH) $(if $(QUICK),--seed 0) --out $(CASE_OUT)/compare
	$(HARNESS) sim --scenario $* $(SEARCH) --json $(CASE_OUT)/sim.json --out $(CASE_OUT)/sim
	$(HARNESS) run $(EMU) $(EACH)
	$(HARNESS) sim compare $(CASE_OUT)/emu --csv $(CASE_OUT)/sim-vs-emu.csv
	$(HARNESS) report runs $(CASE_OUT)/emu
	$(HARNESS) report case $(CASE_OUT)

# A paper's evaluation regenerated beside its published numbers, a verdict per claim: `make reproduce-hetpipe`
# writes results/reproduce/hetpipe/report.md (QUICK=1: a first look, into results/reproduce/hetpipe/quick/).
# `make reproduce-all`: every paper in turn, then results/reproduce/index.md (QUICK=1: index-quick.md) linking
# their reports with their verdict counts.
REPRODUCE_PAPERS := hetpipe owl sky dtfm cocktail
.PHONY: $(addprefix reproduce-,$(REPRODUCE_PAPERS) all)
$(addprefix reproduce-,$(REPRODUCE_PAPERS) all): reproduce-%: $(STAMP) system-deps
	$(HARNESS) reproduce $* $(if $(QUICK),--quick)

net-clean: $(STAMP)
	$(HARNESS) net clean

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks build *.egg-info
