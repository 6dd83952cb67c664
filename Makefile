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
SCENARIO5_OUT ?= results/5-worldwide

.PHONY: all venv system-deps test bench scenario-5 clean net-clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

venv: $(STAMP)

# iproute2 + kmod for namespaces and modules; user-mode-linux boots a 6.1 kernel with
# sch_netem as a process when the host kernel lacks it (see harness/network/kernel.py).
system-deps:
	@if command -v linux.uml >/dev/null && command -v ip >/dev/null && command -v modprobe >/dev/null; then \
	  echo "system packages present (user-mode-linux, iproute2, kmod)"; \
	elif [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq user-mode-linux kmod iproute2 >/dev/null; \
	else \
	  echo "system-deps: run as root (apt-get install user-mode-linux kmod iproute2)"; exit 1; \
	fi

test: $(STAMP) system-deps
	$(PY) -m pytest tests --ignore=tests/bench -q

bench: $(STAMP) system-deps
	$(PY) -m pytest tests/bench --benchmark-only --benchmark-columns=min,median,max,rounds -q

# The world-wide case: scenario summary and heatmaps, a scheduled assignment, the
# scheduler comparison (Fig. 4). Later stages extend this target.
scenario-5: $(STAMP) system-deps
	$(HARNESS) scenario show 5 --out $(SCENARIO5_OUT)
	$(HARNESS) schedule --scenario 5 --scheduler ga --json $(SCENARIO5_OUT)/schedule-ga.json
	$(HARNESS) schedule compare --scenario 5 --out $(SCENARIO5_OUT)

net-clean: $(STAMP)
	$(HARNESS) net clean

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks build *.egg-info
