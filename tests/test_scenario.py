import textwrap

import numpy as np
import pytest

from harness.scenario import ScenarioError, list_scenarios, load_scenario
from harness.scenario.transport import Transport


def test_every_paper_scenario_loads_at_full_scale():
    sizes = {load_scenario(s).name: load_scenario(s).n for s in list_scenarios()}
    assert {k: v for k, v in sizes.items() if k[0].isdigit()} == {
        "1-datacenter": 64, "2-spot": 64, "3-multi-dc": 64, "4-regional": 64, "5-worldwide": 64}
    assert sizes["fluidstack"] == 32


def test_case5_device_matrices_follow_regions():
    t = load_scenario("5")
    oregon, virginia, seoul = 0, 8, 32  # 8 devices per region, in file order
    assert t.region_of(oregon).name == "Oregon" and t.region_of(seoul).name == "Seoul"
    assert t.delay_ms[oregon, virginia + 3] == 67 and t.bandwidth_gbps[oregon, virginia + 3] == 1.15
    assert t.delay_ms[seoul, oregon] == 124 and t.bandwidth_gbps[seoul, oregon] == 0.46
    assert t.delay_ms[1, 2] == 5 and t.bandwidth_gbps[1, 2] == 2  # inside Oregon
    assert np.all(np.diag(t.delay_ms) == 0) and np.all(np.isinf(np.diag(t.bandwidth_gbps)))


def test_fluidstack_is_asymmetric_and_per_region_intra_links():
    t = load_scenario("fluidstack")
    mid, east = 0, 16
    assert t.bandwidth_gbps[mid, east] == 3.87 and t.bandwidth_gbps[east, mid] == 3.73
    assert t.bandwidth_gbps[0, 1] == 10.40 and t.bandwidth_gbps[16, 17] == 11.98
    assert t.profiles[0].gpu == "A40" and t.profiles[0].peak_tflops == 149.7


def test_symmetrised_graph_is_the_mean_of_both_directions():
    t = load_scenario("fluidstack")
    delay_s, bw = t.symmetric()
    assert bw[0, 16] == pytest.approx((3.87 + 3.73) / 2 * 1e9)
    assert delay_s[0, 16] == pytest.approx(0.0218)


@pytest.mark.parametrize("k,per_region", [(8, 1), (16, 2), (32, 4)])
def test_scale_down_keeps_one_share_per_region(k, per_region):
    full, t = load_scenario("5"), load_scenario("5", devices=k)
    assert t.n == k and [r.devices for r in t.regions] == [per_region] * 8
    # the region-level links are unchanged: device 0 (Oregon) to the first Tokyo device
    tokyo = 3 * per_region
    assert t.delay_ms[0, tokyo] == full.delay_ms[0, 24] and t.bandwidth_gbps[0, tokyo] == full.bandwidth_gbps[0, 24]


def test_scale_down_shrinks_groups_of_nodes_evenly_so_both_links_survive():
    t = load_scenario("2", devices=8)  # 8 x 4-GPU nodes + 32 single nodes -> 2 nodes of 2 + 4 singles
    assert [r.devices for r in t.regions] == [2, 2, 1, 1, 1, 1]
    assert t.bandwidth_gbps[0, 1] == 100 and t.bandwidth_gbps[1, 2] == 10 and t.bandwidth_gbps[4, 5] == 10
    one = load_scenario("1", devices=8)  # 8 nodes x 8 -> 2 nodes x 4: NVLink inside, 25 Gbps between
    assert [r.devices for r in one.regions] == [4, 4]
    assert one.bandwidth_gbps[0, 3] == 1200 and one.bandwidth_gbps[3, 4] == 25
    assert [r.devices for r in load_scenario("1", devices=16).regions] == [4] * 4
    assert [r.devices for r in load_scenario("1", devices=32).regions] == [8] * 4  # a tie: fewer, larger nodes
    assert [r.devices for r in load_scenario("sky", devices=16).regions] == [1] * 16  # 1-GPU nodes: whole


def test_a_scenario_is_found_by_its_whole_name_before_a_case_prefix():
    """`sky` is a scenario of its own and the first word of `sky-worldwide`: the whole name wins; a prefix that
    is no scenario's whole name (`owl`) stays ambiguous."""
    assert load_scenario("sky").name == "sky" and load_scenario("sky-worldwide").name == "sky-worldwide"
    assert load_scenario("5").name == "5-worldwide"
    with pytest.raises(ScenarioError, match="owl: unknown scenario"):
        load_scenario("owl")


def test_sky_worldwide_puts_skys_nodes_in_case_5s_regions():
    geo, sky, case5 = load_scenario("sky-worldwide"), load_scenario("sky", devices=8), load_scenario("5", devices=8)
    assert [p.slowdown for p in geo.profiles] == pytest.approx([p.slowdown for p in sky.profiles], abs=5e-4)
    assert {p.gpu for p in geo.profiles} == {"P100"}
    assert (geo.bandwidth_gbps == case5.bandwidth_gbps).all() and (geo.delay_ms == case5.delay_ms).all()


def test_scale_down_that_breaks_structure_lists_valid_counts():
    with pytest.raises(ScenarioError, match=r"5-worldwide.yaml: --devices: 12 .*valid: 8, 16, 32, 64"):
        load_scenario("5", devices=12)


GOOD = """\
name: t
device: {gpu: X, peak_tflops: 1, memory_gb: 1}
regions:
  - {name: A, devices: 2}
  - {name: B, devices: 2}
intra_region: {delay_ms: 1, bandwidth_gbps: 10}
inter_region:
  order: [A, B]
  delay_ms: [[~, 20], [30, ~]]
  bandwidth_gbps: [[~, 1.5], [2.5, ~]]
"""


def write(tmp_path, text):
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_a_small_valid_file_gives_asymmetric_device_matrices(tmp_path):
    t = load_scenario(str(write(tmp_path, GOOD)))
    assert t.delay_ms.tolist() == [[0, 1, 20, 20], [1, 0, 20, 20], [30, 30, 0, 1], [30, 30, 1, 0]]
    assert t.bandwidth_gbps[0, 2] == 1.5 and t.bandwidth_gbps[2, 0] == 2.5


@pytest.mark.parametrize("old,new,field,value", [
    ("delay_ms: [[~, 20], [30, ~]]", "delay_ms: [[~, 20, 1], [30, ~, 1]]", "inter_region.delay_ms", "2x2"),
    ("[[~, 1.5], [2.5, ~]]", "[[~, -1.5], [2.5, ~]]", "inter_region.bandwidth_gbps[0][1]", "-1.5"),
    ("[[~, 1.5], [2.5, ~]]", "[[~, 0], [2.5, ~]]", "inter_region.bandwidth_gbps[0][1]", "0"),
    ("[[~, 20], [30, ~]]", "[[~, 20], [-3, ~]]", "inter_region.delay_ms[1][0]", "-3"),
    ("order: [A, B]", "order: [A, C]", "inter_region.order", "'C'"),
    ("{delay_ms: 1, bandwidth_gbps: 10}", "{delay_ms: 1, bandwidth_gbps: 10, jitter: 2}", "intra_region", "jitter"),
    ("{name: B, devices: 2}", "{name: B, devices: 0}", "regions[1].devices", "0"),
    ("name: t\n", "name: t\nregions: [\n", "YAML syntax error", "line"),
    ("name: t\n", "name: t\ntransport: {congestion_control: vegas}\n", "transport.congestion_control", "vegas"),
    ("name: t\n", "name: t\ntransport: {slow_start_after_idle: 0}\n", "transport.slow_start_after_idle", "0"),
    ("name: t\n", "name: t\ntransport: {rmem_max_bytes: 1024}\n", "transport.rmem_max_bytes", "1024"),
    ("name: t\n", "name: t\ntransport: {wmem_max_bytes: big}\n", "transport.wmem_max_bytes", "big"),
    ("name: t\n", "name: t\ntransport: {initcwnd: 20}\n", "transport.initcwnd", "unknown key"),
    ("name: t\n", "name: t\ntransport: cubic\n", "transport", "cubic"),
    ("name: t\n", "name: t\ninterface_gbps: 0\n", "interface_gbps", "0"),
    ("{name: B, devices: 2}", "{name: B, devices: 2, interface_gbps: fast}", "regions[1].interface_gbps", "fast"),
    ("{name: B, devices: 2}", "{name: B, devices: 2, interface_gbps: -1}", "regions[1].interface_gbps", "-1"),
    ("{name: B, devices: 2}", "{name: B, devices: 2, shared_nic_gbps: 0}", "regions[1].shared_nic_gbps", "0"),
    ("name: t\n", "name: t\nlink_classes: node\n", "link_classes", "node"),
])
def test_bad_input_names_file_field_and_value(tmp_path, old, new, field, value):
    assert old in GOOD
    p = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ScenarioError) as e:
        load_scenario(str(p))
    msg = str(e.value)
    assert str(p) in msg and field in msg and value in msg and "\n" not in msg


def test_interface_gbps_is_per_region_with_a_file_wide_default_and_scales_with_the_links(tmp_path):
    assert load_scenario(str(write(tmp_path, GOOD))).interface_gbps is None  # no limit beyond the pairs
    t = load_scenario(str(write(tmp_path, GOOD.replace("name: t\n", "name: t\ninterface_gbps: 4\n", 1).replace(
        "{name: B, devices: 2}", "{name: B, devices: 2, interface_gbps: 0.5}", 1))))
    assert t.interface_gbps.tolist() == [4, 4, 0.5, 0.5]  # A takes the file's, B its own
    assert t.scaled(0.01).interface_gbps.tolist() == pytest.approx([0.04, 0.04, 0.005, 0.005])
    assert t.subset([3, 0]).interface_gbps.tolist() == [0.5, 4]


def test_shared_nic_is_one_per_region_of_a_group_and_scales_and_cuts_with_the_regions(tmp_path):
    assert load_scenario(str(write(tmp_path, GOOD))).region_nic_gbps is None
    two_nodes = (GOOD.replace("{name: A, devices: 2}", "{name: A, devices: 2, count: 2, shared_nic_gbps: 25}", 1)
                 .replace("order: [A, B]", "order: [A-0, A-1, B]")
                 .replace("[[~, 20], [30, ~]]", "[[~, 5, 20], [5, ~, 20], [30, 30, ~]]")
                 .replace("[[~, 1.5], [2.5, ~]]", "[[~, 9, 1.5], [9, ~, 1.5], [2.5, 2.5, ~]]"))
    t = load_scenario(str(write(tmp_path, two_nodes)))
    assert t.region_nic_gbps.tolist() == [25, 25, np.inf]  # one NIC per region of the group; B has none
    assert t.scaled(0.1).region_nic_gbps.tolist() == pytest.approx([2.5, 2.5, np.inf])
    cut = t.subset([4, 2])  # B's device first, then A-1's: the regions in their order (A-1, B)
    assert [r.name for r in cut.regions] == ["A-1", "B"] and cut.region_nic_gbps.tolist() == [25, np.inf]


def test_transport_defaults_to_linux_and_a_file_overrides_what_it_names(tmp_path):
    t = load_scenario(str(write(tmp_path, GOOD)))
    assert t.transport == Transport() == Transport(None, True, 6291456, 4194304)
    # the congestion control is the kernel's own unless the scenario names one
    assert t.transport.sysctls() == {"tcp_slow_start_after_idle": "1",
                                     "tcp_rmem": "4096 131072 6291456", "tcp_wmem": "4096 16384 4194304"}
    t = load_scenario(str(write(tmp_path, GOOD.replace(
        "name: t\n", "name: t\ntransport: {congestion_control: bbr, wmem_max_bytes: auto}\n", 1))))
    assert t.transport == Transport("bbr", True, 6291456, "auto")
    assert t.transport.resolved(1e3).sysctls()["tcp_congestion_control"] == "bbr"
    assert t.scaled(0.1).transport == t.subset([0, 2]).transport == t.transport
    # auto: 4 round-trip BDPs, at least Linux's 6 MiB, at most 256 MiB
    assert t.transport.resolved(10e6).wmem_max_bytes == 40_000_000
    assert t.transport.resolved(1e3).wmem_max_bytes == 6291456
    assert t.transport.resolved(1e9).wmem_max_bytes == 256 << 20
    assert t.transport.resolved(1e9).rmem_max_bytes == 6291456
    with pytest.raises(ValueError, match="resolve"):
        t.transport.sysctls()


def test_missing_file_and_unknown_scenario(tmp_path):
    with pytest.raises(ScenarioError, match="file not found"):
        load_scenario(str(tmp_path / "nope.yaml"))
    with pytest.raises(ScenarioError, match="unknown scenario"):
        load_scenario("9")


def test_cli_reports_bad_input_as_one_line(cli, tmp_path):
    p = write(tmp_path, GOOD.replace("[[~, 1.5], [2.5, ~]]", "[[~, -1], [2.5, ~]]"))
    rc, out, err = cli("scenario", "show", p, "--no-plots")
    assert rc == 2 and err.count("\n") == 1 and "bandwidth_gbps[0][1]" in err and "Traceback" not in err
    rc, out, err = cli("scenario", "show", "5", "--devices", "12", "--no-plots")
    assert rc == 2 and "valid: 8, 16, 32, 64" in err


def test_cli_export_and_show(cli, tmp_path):
    import json

    rc, out, _ = cli("scenario", "export", "5", "--devices", "8", "--json")
    doc = json.loads(out)
    assert rc == 0 and len(doc["delay_ms"]) == 8 and doc["bandwidth_gbps"][0][0] is None
    assert doc["regions"][3] == "Tokyo" and doc["delay_ms"][3][4] == 34
    rc, out, _ = cli("scenario", "show", "4", "--out", tmp_path)
    assert rc == 0 and "California" in out
    for f in ("summary.txt", "delay.png", "bandwidth.png"):
        assert (tmp_path / f).stat().st_size > 0
    assert (tmp_path / "delay.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("devices,count,action", [(100000, 1, "export"), (1, 100000, "show")])
def test_a_scenario_too_large_for_this_machine_fails_in_one_line_before_allocating(cli, tmp_path, devices,
                                                                                   count, action):
    """100000 regions: the region x region matrices alone would need hundreds of GiB. 100000 devices in few
    regions load (links are held by region) and show; what needs device x device matrices (export) refuses."""
    import os

    assert 6 * 8 * 100000 ** 2 > os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # the premise
    p = write(tmp_path, GOOD.replace("{name: A, devices: 2}", f"{{name: A, devices: {devices}, count: {count}}}"))
    if action == "export":
        rc, out, err = cli("scenario", "show", p, "--no-plots")
        assert rc == 0 and "100002 devices in 2 regions" in out, err
    rc, out, err = cli("scenario", action, p, "--json" if action == "export" else "--no-plots")
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"{p}: regions: 100,00" in err and "more than this machine's" in err and "at most about" in err
    assert not out  # nothing half-written


@pytest.mark.parametrize("value", [0, 65, 2.5, "16", True])
def test_nccl_sockets_must_be_an_integer_nccl_can_open(tmp_path, value):
    path = tmp_path / "s.yaml"
    path.write_text("name: s\ndevice: {gpu: V100}\nregions: [{name: a, devices: 2}]\n"
                    "intra_region: {delay_ms: 1, bandwidth_gbps: 1}\n"
                    "inter_region: {delay_ms: 1, bandwidth_gbps: 1}\n"
                    f"nccl_sockets: {value!r}\n".replace("'", '"'))
    with pytest.raises(ScenarioError, match=r"nccl_sockets: must be an integer from 1 to 64"):
        load_scenario(path)


def test_a_scenario_of_some_regions_keeps_their_gpus_and_links(tmp_path):
    from harness.scenario import write_regions

    full = load_scenario("hetpipe-testbed")
    path = write_regions("hetpipe-testbed", "VQ", tmp_path / "vq.yaml")
    t = load_scenario(str(path), 4)  # two of each, as --devices scales every region
    assert t.name == "hetpipe-testbed-VQ" and [r.name for r in t.regions] == ["V", "Q"]
    assert [p.gpu for p in t.profiles] == [full.profiles[0].gpu] * 2 + [full.profiles[12].gpu] * 2
    assert t.bandwidth_gbps[0, 1] == full.bandwidth_gbps[0, 1] and t.bandwidth_gbps[0, 2] == full.bandwidth_gbps[0, 4]
    assert t.delay_ms[1, 3] == full.delay_ms[1, 13]


@pytest.mark.parametrize("scenario, regions, says", [("hetpipe-testbed", "VX", "distinct names of its regions"),
                                                     ("hetpipe-testbed", "VV", "distinct names of its regions"),
                                                     ("hetpipe-testbed", "", "distinct names of its regions"),
                                                     ("5", ["Oregon"], "link matrix")])
def test_a_scenario_of_some_regions_refuses_what_it_cannot_cut_in_one_line(tmp_path, scenario, regions, says):
    from harness.scenario import write_regions

    with pytest.raises(ScenarioError, match=says) as e:
        write_regions(scenario, regions, tmp_path / "x.yaml")
    assert "\n" not in str(e.value) and not (tmp_path / "x.yaml").exists()
