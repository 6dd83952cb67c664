"""The map of which system wins where (harness/report/map.py, `harness sim report --map`): each cell's winner is the
contender of the highest simulated throughput, its margin over the runner-up, and a codec gains most where
bandwidth is scarce."""
from __future__ import annotations

import csv
import json
import math

import pytest

from harness.report import map as smap
from harness.sim.request import SimSettings

pytestmark = pytest.mark.timeout(600)

FEW = tuple(c for c in smap.CONTENDERS if c.label in ("ours", "ours+cocktail", "megatron", "diloco"))
SETTINGS = SimSettings(budget=200, cache_dir=None)


@pytest.fixture(scope="module")
def cells():
    return smap.sweep_map(("5",), (0.1, 10.0), FEW, SETTINGS)


def test_each_cell_is_won_by_its_fastest_contender_with_its_margin(cells):
    assert [(c.scenario, c.scale) for c in cells] == [("5", 0.1), ("5", 10.0)]
    for cell in cells:
        assert set(cell.samples_per_s) == {c.label for c in FEW}, cell.left_out
        ranked = sorted(cell.samples_per_s.values(), reverse=True)
        assert cell.samples_per_s[cell.best] == ranked[0]
        assert cell.margin == pytest.approx(ranked[0] / ranked[1]) and cell.margin >= 1
        fitting = [v for k, v in cell.samples_per_s.items() if not cell.over_memory[k]]
        assert cell.best_fitting is None or cell.samples_per_s[cell.best_fitting] == max(fitting)
    slow, fast = cells
    for label in ("ours", "megatron"):  # more bandwidth is never slower
        assert fast.samples_per_s[label] >= slow.samples_per_s[label]
    # the codec's gain over plain ours is largest where the links are slowest
    gain = [c.samples_per_s["ours+cocktail"] / c.samples_per_s["ours"] for c in cells]
    assert gain[0] > gain[1] >= 0.99


def test_the_map_is_written_as_a_table_a_json_a_figure_and_a_page(cells, tmp_path):
    paths = smap.write_map(tmp_path, cells, "test-run", FEW)
    assert {p.name for p in paths} == {"map.csv", "map.json", "map.png", "report.md", "manifest.json"}
    rows = list(csv.DictReader(open(tmp_path / "map.csv")))
    assert [r["best"] for r in rows] == [c.best for c in cells]
    assert float(rows[0]["ours"]) == pytest.approx(cells[0].samples_per_s["ours"], rel=1e-4)
    doc = json.loads((tmp_path / "map.json").read_text())
    assert doc[1]["margin"] == pytest.approx(cells[1].margin)
    page = (tmp_path / "report.md").read_text()
    star = "*" if cells[0].over_memory[cells[0].best] else ""
    assert "| 5 | " in page and f"{cells[0].best}{star} x{cells[0].margin:.2f}" in page
    fits = cells[0].best_fitting
    assert [r["best_that_fits"] for r in rows][0] == fits and not cells[0].over_memory[fits]
    assert (tmp_path / "map.png").stat().st_size > 10_000


def test_a_contender_that_cannot_run_is_left_out_with_its_reason():
    cell = smap.sweep_map(("1",), (1.0,), (smap.Contender("ours", "ours"),
                                           smap.Contender("ours-bad", "ours", (("dp_compress", "zip"),))), SETTINGS)[0]
    assert set(cell.samples_per_s) == {"ours"} and "unknown codec 'zip'" in cell.left_out["ours-bad"]
    assert math.isinf(cell.margin) and cell.best == "ours"


def test_the_cli_draws_the_map_and_refuses_its_flags_alone(cli, tmp_path):
    rc, out, err = cli("sim", "report", "--map-scales", "1", "--out", tmp_path / "x")
    assert rc != 0 and "--map-scenarios/--map-scales: options of --map" in err and not (tmp_path / "x").exists()
    rc, out, err = cli("sim", "report", "--map", "--map-scenarios", "1", "--map-scales", "1", "--budget", "100",
                       "--no-cache", "--out", tmp_path / "m")
    assert rc == 0, err
    assert "wrote" in out and (tmp_path / "m" / "map.png").exists()
    rows = list(csv.DictReader(open(tmp_path / "m" / "map.csv")))
    assert len(rows) == 1 and rows[0]["best"] in {c.label for c in smap.CONTENDERS}
