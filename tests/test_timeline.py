"""Timelines (harness/scenario/timeline.py): parsing with one-line errors, the cursor, link state, prediction."""
import textwrap
from pathlib import Path

import numpy as np
import pytest

from harness.errors import HarnessError
from harness.scenario import SCENARIO_DIR, ScenarioError, load_scenario, load_timeline
from harness.scenario.timeline import DOWN_GBPS, LinkState
from harness.sim.timeline import predict_iterations

TIMELINES = SCENARIO_DIR / "timelines"


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize("case,name", [("5", "5-worldwide-link-halves.yaml"), ("4", "4-regional-link-down.yaml"),
                                       ("5", "5-worldwide-diurnal.yaml"), ("5", "5-worldwide-diurnal.csv")])
def test_example_timelines_load_for_their_cases(case, name):
    tl = load_timeline(TIMELINES / name, load_scenario(case, devices=8))
    assert tl.events or tl.trace


def test_events_change_both_directions_unless_one_way_and_restore_puts_the_scenario_back(tmp_path):
    topo = load_scenario("5", devices=8).scaled(0.5)
    tl = load_timeline(TIMELINES / "5-worldwide-link-halves.yaml", topo)
    state = LinkState.initial(topo)
    va, oh = state.regions("Tokyo")[0], state.regions("Seoul")[0]
    cur = tl.cursor()
    assert cur.due(1e9, 3) == []  # iteration events wait for their iteration, whatever the time
    (halve,) = cur.due(0.0, 4)
    assert sorted(state.apply(halve)) == [(va, oh), (oh, va)]
    assert state.bandwidth_gbps[va, oh] == pytest.approx(1.1 * 0.5 * 0.5)  # of the scaled link
    assert state.bandwidth_gbps[oh, va] == pytest.approx(1.1 * 0.5 * 0.5)
    (back,) = cur.due(0.0, 8)
    state.apply(back)
    np.testing.assert_array_equal(state.bandwidth_gbps, topo.region_bandwidth_gbps)
    one = load_timeline(write(tmp_path, "one.yaml", """
        events:
          - {at_s: 5, from: Tokyo, to: Seoul, one_way: true, delay_ms: 40}
    """), topo)
    s2 = LinkState.initial(topo)
    (c,) = one.cursor().due(5.0)
    assert s2.apply(c) == [(va, oh)] and s2.delay_ms[va, oh] == 40 and s2.delay_ms[oh, va] == 34


def test_a_group_name_with_count_names_every_region_of_it_and_a_star_names_all():
    topo = load_scenario("1")  # 8 nodes x 8 from one entry with count
    state = LinkState.initial(topo)
    assert len(state.regions(topo.regions[0].group)) == len(topo.regions) > 1
    assert LinkState.initial(load_scenario("5")).regions("*") == list(range(8))


def test_cursor_merges_events_and_a_wrapped_trace_in_time_order(tmp_path):
    topo = load_scenario("5", devices=8)
    write(tmp_path, "t.csv", "time_s,from,to,rate_gbps,delay_ms\n0,Oregon,Ohio,1,\n10,Oregon,Ohio,0.5,30\n")
    tl = load_timeline(write(tmp_path, "t.yaml", """
        trace: {file: t.csv, at_end: wrap}
        events:
          - {at_s: 15, from: Tokyo, to: Seoul, loss_pct: 1}
    """), topo)
    assert tl.trace.period_s == 20  # last row + last interval
    cur = tl.cursor()
    got = [(c.at_s, c.src) for c in cur.due(45)]
    assert got == [(0, "Oregon"), (10, "Oregon"), (15, "Tokyo"), (20, "Oregon"), (30, "Oregon"), (40, "Oregon")]
    assert cur.next_at_s() == 50
    held = load_timeline(tmp_path / "t.csv", topo).cursor()  # a CSV alone holds at its end
    assert len(held.due(1e6)) == 2 and held.next_at_s() is None


def test_prediction_runs_an_iteration_that_a_change_falls_inside_as_a_fluid(tmp_path):
    topo = load_scenario("4", devices=8)
    tl = load_timeline(TIMELINES / "4-regional-link-down.yaml", topo)
    cal, ore = 0, 2
    assert topo.regions[cal].name == "California" and topo.regions[ore].name == "Oregon"
    # an iteration: 3 s of compute plus 1 s per Gbps-inverse of the California-Oregon link (T s)
    T = 3 + 1 / topo.region_bandwidth_gbps[cal, ore]
    pred = predict_iterations(tl, topo, 12, lambda t: 3 + 1 / t.region_bandwidth_gbps[cal, ore])
    k = int(20 // T)  # the iteration under way when the link goes down at 20 s
    assert [p.seconds for p in pred[:k]] == pytest.approx([T] * k)
    # the part of it done by 20 s stays done; nothing moves until 30 s; then the rest at the old pace
    assert pred[k].start_s == pytest.approx(k * T) and pred[k].seconds == pytest.approx(T + 10)
    assert pred[k].changes == 2 and pred[k + 1].seconds == pytest.approx(T)


def test_a_link_cut_for_good_is_one_line_and_an_unused_cut_link_costs_nothing(tmp_path):
    topo = load_scenario("4", devices=8)
    tl = load_timeline(write(tmp_path, "cut.yaml", """
        events: [{at_iteration: 2, from: California, to: Oregon, down: true}]
    """), topo)
    with pytest.raises(HarnessError, match="iteration 2 never ends"):
        predict_iterations(tl, topo, 4, lambda t: 1 / t.region_bandwidth_gbps[0, 2])
    pred = predict_iterations(tl, topo, 4, lambda t: 1 / t.region_bandwidth_gbps[1, 3])
    assert [p.seconds for p in pred] == pytest.approx([1 / topo.region_bandwidth_gbps[1, 3]] * 4)
    assert LinkState.initial(topo).topology(topo).region_bandwidth_gbps.min() > DOWN_GBPS


def test_a_scenario_carries_its_timeline_and_a_smaller_world_keeps_it(tmp_path):
    text = (SCENARIO_DIR / "5-worldwide.yaml").read_text() + textwrap.dedent("""
        timeline:
          events: [{at_s: 1, from: Tokyo, to: Seoul, bandwidth_gbps: 0.1}]
    """)
    topo = load_scenario(str(write(tmp_path, "s.yaml", text)))
    assert topo.timeline.events[0].dst == "Seoul"
    assert load_scenario(str(tmp_path / "s.yaml"), devices=8).timeline == topo.timeline


BAD = [
    ("events: [{at_s: 1, from: Mars, to: Ohio, delay_ms: 3}]", "timeline.events[0].from: unknown region"),
    ("events: [{from: Oregon, to: Ohio, delay_ms: 3}]", "needs exactly one of at_s, at_iteration"),
    ("events: [{at_s: 1, at_iteration: 2, from: Oregon, to: Ohio, delay_ms: 3}]", "exactly one of"),
    ("events: [{at_s: -1, from: Oregon, to: Ohio, delay_ms: 3}]", "events[0].at_s: must be >= 0"),
    ("events: [{at_iteration: 1.5, from: Oregon, to: Ohio, delay_ms: 3}]", "at_iteration: must be an integer"),
    ("events: [{at_s: 1, from: Oregon, to: Ohio}]", "changes nothing"),
    ("events: [{at_s: 1, from: Oregon, to: Ohio, bandwidth_gbps: 0}]", "bandwidth_gbps: must be > 0"),
    ("events: [{at_s: 1, from: Oregon, to: Ohio, loss_pct: 101}]", "loss_pct: must be >= 0 and <= 100"),
    ("events: [{at_s: 1, from: Oregon, to: Ohio, down: true, delay_ms: 3}]", "down: goes alone"),
    ("events: [{at_s: 1, from: Oregon, to: Ohio, down: 1}]", "down: must be true or false"),
    ("events: [{at_s: 1, from: Oregon, to: Ohio, bandwidth_gbps: 1, bandwidth_factor: 2}]", "not both"),
    ("events: [{at_s: 1, from: Oregon, to: Ohio, rate: 1}]", "events[0].rate: unknown key"),
    ("events: 3", "timeline.events: must be a list"),
    ("speed: 3", "timeline.speed: unknown key"),
    ("trace: {file: missing.csv}", "timeline.trace.file: "),
    ("trace: {file: t.csv, at_end: loop}", "at_end: must be one of hold, wrap"),
    ("trace: {file: t.csv, at_end: wrap, period_s: 5}", "period_s: a wrapped trace needs a period beyond"),
]


BAD_CSV = [
    ("time,from,to,rate,delay\n", "line 1: header must be time_s,from,to,rate_gbps,delay_ms"),
    ("time_s,from,to,rate_gbps,delay_ms\n", "no rows"),
    ("time_s,from,to,rate_gbps,delay_ms\n1,Oregon,Ohio,fast,\n", "line 2: rate_gbps: must be a number"),
    ("time_s,from,to,rate_gbps,delay_ms\n5,Oregon,Ohio,1,\n4,Oregon,Ohio,1,\n", "line 3: time_s: goes back in time"),
    ("time_s,from,to,rate_gbps,delay_ms\n1,Oregon,Pluto,1,\n", "line 2: to: unknown region"),
    ("time_s,from,to,rate_gbps,delay_ms\n1,Oregon,Ohio,,\n", "line 2: changes nothing"),
    ("time_s,from,to,rate_gbps,delay_ms\n1,Oregon,Ohio,1\n", "line 2: needs 5 cells"),
    ("time_s,from,to,rate_gbps,delay_ms\n1,Oregon,Ohio,-1,\n", "line 2: rate_gbps: must be > 0"),
]


@pytest.mark.parametrize("name,text,message", [("bad.yaml", t, m) for t, m in BAD]
                         + [("bad.csv", t, m) for t, m in BAD_CSV])
def test_bad_timelines_and_traces_are_one_line_naming_file_and_field_or_row(tmp_path, name, text, message):
    write(tmp_path, "t.csv", "time_s,from,to,rate_gbps,delay_ms\n0,Oregon,Ohio,1,\n10,Oregon,Ohio,0.5,30\n")
    p = write(tmp_path, name, text)
    with pytest.raises(ScenarioError) as e:
        load_timeline(p, load_scenario("5", devices=8))
    assert message in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


def test_a_timeline_on_device_level_links_is_refused():
    topo = load_scenario("5", devices=8)
    topo = topo.with_device_links(delay_ms=topo.delay_ms * 2)
    with pytest.raises(ScenarioError, match="device-level links"):
        LinkState.initial(topo)
