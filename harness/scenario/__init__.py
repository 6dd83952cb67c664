"""Scenario files -> `Topology`: device-level one-way delay and bandwidth matrices.

A scenario file describes regions (groups of devices sharing link properties), the
link inside a region and the links between regions (scalar, or a matrix in an
`order` of region names, possibly asymmetric). It is parsed once into frozen data;
unknown keys and bad values raise `ScenarioError` whose message names the file,
the field and the value, so the CLI can print one line and exit non-zero.

The data (`Topology` and its parts) is in topology.py, the parsing of a file in parse.py; this module
finds scenario files by name and loads them.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

from ..errors import HarnessError
from ..files import atomic_write_text, read_text
from .parse import parse_scenario
from .timeline import Timeline, parse_timeline, parse_trace_csv, region_names, trace_of
from .topology import DeviceProfile, Link, Region, ScenarioError, Server, Topology, scale_down  # noqa: F401

class YAMLLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats: `5e-1` and `1e3` are numbers (YAML 1.1, PyYAML's
    default, reads a float without a dot as a string)."""


YAMLLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def load_yaml(path: Path, what: str):
    """The document of a YAML file; a one-line HarnessError if it cannot be read (files.read_text)."""
    return yaml.load(read_text(path, what), Loader=YAMLLoader)


#: The paper's five cases (scenarios/1-*.yaml ... 5-*.yaml), by number.
PAPER_CASES = ("1", "2", "3", "4", "5")

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "scenarios"


def list_scenarios() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def resolve_scenario(name: str) -> Path:
    """Accept a path, a file stem (`5-worldwide`) or a case number (`5`)."""
    p = Path(name)
    if not str(name).strip():
        raise ScenarioError(f"{name!r}: empty scenario name (a case number 1-5, a name or a path to a .yaml file)")
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.exists():
            raise ScenarioError(f"{p}: file not found")
        if not p.is_file():
            raise ScenarioError(f"{p}: not a scenario file (a directory?)")
        return p
    known = list_scenarios()
    matches = [name] if name in known else [s for s in known if s.split("-", 1)[0] == name]  # a name before a case
    if len(matches) != 1:
        raise ScenarioError(
            f"{name}: unknown scenario (known: {', '.join(list_scenarios())}, or a path to a .yaml file)"
        )
    return SCENARIO_DIR / f"{matches[0]}.yaml"


def reload_name(topo: Topology) -> str:
    """What load_scenario takes to load `topo` again anywhere: the name of one of scenarios/, else the
    absolute path of its file (records keep it, so a scenario given as a path can be simulated later)."""
    path = Path(topo.source).resolve()
    return path.stem if path.parent == SCENARIO_DIR.resolve() else str(path)


def load_scenario(name: str, devices: int | None = None) -> Topology:
    """Load a scenario by case number, name or path; optionally scale it to `devices`."""
    path = resolve_scenario(name)
    try:
        doc = load_yaml(path, "scenario YAML")
    except HarnessError as e:  # unreadable: a ScenarioError as every other mistake in a scenario
        raise ScenarioError(str(e)) from None
    except yaml.YAMLError as e:
        raise _syntax_error(path, e) from None
    topo = parse_scenario(doc, path)
    return scale_down(topo, devices) if devices is not None else topo


def write_regions(name: str, regions, out: Path) -> Path:
    """A scenario of some of `name`'s regions, written to `out` (YAML), its links, GPUs and transport the
    original's: a run on some of a cluster's nodes names a scenario of its own. `regions`: names, or one string
    of one-letter names as `--gpus` and HetPipe's Table 4 write them ("VR": `<name>-VR`). A scenario whose links
    between regions are a matrix, or that has a timeline, is refused: what they name would have to be cut too."""
    source = resolve_scenario(name)
    doc = load_yaml(source, "scenario YAML")
    names, known = list(regions), [r.get("name") for r in doc.get("regions", [])]
    if not names or any(r not in known for r in names) or len(set(names)) != len(names):
        raise ScenarioError(f"{source}: regions: {regions!r} must be distinct names of its regions "
                            f"({', '.join(map(str, known))})")
    if "order" in (doc.get("inter_region") or {}) or "timeline" in doc:
        raise ScenarioError(f"{source}: regions {regions!r}: a scenario with a link matrix or a timeline is not cut")
    tag = "".join(names) if isinstance(regions, str) else "-".join(names)
    doc.update(name=f"{doc['name']}-{tag}", description=f"{doc.get('description', doc['name'])} (only {tag})",
               regions=[r for r in doc["regions"] if r["name"] in names])
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, yaml.safe_dump(doc, sort_keys=False))
    return out


def _syntax_error(path, e: yaml.YAMLError) -> ScenarioError:
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}" if mark else "?"
    return ScenarioError(f"{path}: YAML syntax error at {where}: {getattr(e, 'problem', e)}")


def load_timeline(path, topo: Topology):
    """`--timeline FILE`: a YAML file holding a timeline (timeline.py; the `timeline:` key optional), or a trace
    CSV (held at its end); its regions checked against `topo`'s. Every mistake is one ScenarioError line."""
    path = Path(path)
    known = region_names(topo.regions)
    try:
        text = read_text(path, "timeline (YAML, or a trace CSV)")
    except HarnessError as e:
        raise ScenarioError(str(e)) from None
    if path.suffix == ".csv":
        rows = parse_trace_csv(text, str(path), known, False)
        return Timeline(source=str(path), trace=trace_of(rows, str(path), "hold", None))
    try:
        doc = yaml.load(text, Loader=YAMLLoader)
    except yaml.YAMLError as e:
        raise _syntax_error(path, e) from None
    if isinstance(doc, dict) and set(doc) == {"timeline"}:
        doc = doc["timeline"]
    return parse_timeline(doc, path, known)
