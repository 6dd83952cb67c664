"""The package installs on every Python that pyproject.toml claims (3.11-3.13).

The index check asks pip which versions of each requirement have a wheel for the target
interpreter (`pip index versions --python-version X --only-binary :all:`): index pages
only. A full `pip install --dry-run --python-version X` would be the stricter check (it
resolves transitive requirements too), but the index serves no separate wheel metadata
(PEP 658), so pip downloads every wheel to read it: ~0.6 GB for torch alone.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

PROJECT = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
SUPPORTED = ("3.11", "3.12", "3.13")


def requirements() -> list[Requirement]:
    reqs = PROJECT["dependencies"] + [r for extra in PROJECT["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in reqs]


def test_requires_python_admits_supported_versions():
    spec = SpecifierSet(PROJECT["requires-python"])
    for v in SUPPORTED:
        assert Version(v) in spec, v
        assert f"Programming Language :: Python :: {v}" in PROJECT["classifiers"]


def pip(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=timeout)


def index_url() -> str:
    for line in pip("config", "list").stdout.splitlines():
        key, _, value = line.partition("=")
        if key.endswith(".index-url"):
            return value.strip("'\"")
    return "https://pypi.org/simple"


def wheel_versions(req: Requirement, python: str) -> list[str]:
    r = pip("index", "versions", req.name, "--python-version", python, "--only-binary", ":all:", "--json",
            "--retries", "1", "--timeout", "20")
    return json.loads(r.stdout)["versions"] if r.returncode == 0 else []


@pytest.mark.timeout(120)
def test_requirements_have_wheels_for_supported_pythons():
    # Unreachable index: pip's `index versions` just finds nothing, so probe it first.
    url = index_url()
    try:
        urllib.request.urlopen(f"{url.rstrip('/')}/pip/", timeout=15).close()
    except OSError as e:
        pytest.skip(f"package index {url} cannot be reached: {e}")
    cases = [(req, v) for v in SUPPORTED for req in requirements()]
    with ThreadPoolExecutor(8) as pool:
        found = list(pool.map(lambda c: wheel_versions(*c), cases))
    missing = [f"{req} on Python {v}" for (req, v), versions in zip(cases, found)
               if not any(req.specifier.contains(x) for x in versions)]
    assert not missing, f"no wheel satisfies: {missing}"
