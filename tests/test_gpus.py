"""GPU types in scenarios: the vendor-sheet table, device entries per region, slowdown, and bad input."""
import re

import pytest

from harness.scenario.gpus import GPU_TYPES, find_gpu
from harness.compute.profiles import device_profiles
from harness.scenario import ScenarioError, list_scenarios, load_scenario
from tests.test_scenario import write

REQUIRED = ("V100", "A100", "H100", "A40", "T4", "P100", "RTX 3080",
            "TITAN V", "TITAN RTX", "RTX 2060", "Quadro P4000")


def test_the_table_has_every_required_gpu_and_each_figure_is_in_its_source():
    assert set(REQUIRED) <= set(GPU_TYPES)
    for name, g in GPU_TYPES.items():
        assert g.name == name and re.search(r"https://\S+", g.source), name
        for figure in (g.fp16_tflops, g.fp32_tflops, g.memory_bandwidth_gbs):
            assert f"{figure:g}" in g.source, (name, figure)
        assert re.search(rf"\b{g.memory_gb:g} ?GB", g.source), (name, g.memory_gb)
        assert 0 < g.fp32_tflops <= g.fp16_tflops, name


def test_lookup_ignores_case_and_spacing():
    assert find_gpu("titan  rtx").name == "TITAN RTX" and find_gpu("v100").name == "V100"
    assert find_gpu("Voodoo2") is None


def test_existing_scenarios_keep_their_devices():
    for name in list_scenarios():
        for p in load_scenario(name).profiles:
            assert (p.slowdown == 1.0 or name.startswith("sky")) and p.gpu in GPU_TYPES  # Sky Computing's penalties
    v = load_scenario("5").profiles[0]
    assert (v.gpu, v.peak_tflops, v.memory_gb, v.peak("fp32")) == ("V100", 125, 16, 15.7)


MIXED = """\
name: mixed
device: {gpu: V100}
regions:
  - {name: A, devices: 2}
  - {name: B, devices: 1, device: {gpu: titan rtx}}
  - {name: C, devices: 1, device: {slowdown: 4}}
  - {name: D, devices: 1, device: {gpu: MyChip, peak_tflops: 10, memory_gb: 4}}
intra_region: {delay_ms: 1, bandwidth_gbps: 10}
inter_region: {delay_ms: 5, bandwidth_gbps: 1}
"""


def test_devices_per_region_from_the_table_overlaid_or_given(tmp_path):
    t = load_scenario(str(write(tmp_path, MIXED)))
    a, _, b, c, d = t.profiles
    assert (a.gpu, a.peak_tflops, a.memory_gb, a.slowdown) == ("V100", 125, 16, 1.0)
    assert (b.gpu, b.peak_tflops, b.memory_gb, b.peak("fp32")) == ("TITAN RTX", 130, 24, 16.3)
    assert (c.gpu, c.peak_tflops, c.slowdown) == ("V100", 125, 4.0)  # overlays the top-level device
    assert (d.gpu, d.peak("fp16"), d.peak("fp32"), d.memory_gb) == ("MyChip", 10, 10, 4)
    prof = device_profiles(t)
    assert prof[3].flops_per_s("transformer") == pytest.approx(prof[0].flops_per_s("transformer") / 4)
    assert device_profiles(t, dtype="fp32")[0].peak_tflops == 15.7
    sub = t.subset([0, 3])  # scaling down keeps each device's profile
    assert [p.slowdown for p in sub.profiles] == [1.0, 4.0]


@pytest.mark.parametrize("old,new,field,value", [
    ("{gpu: titan rtx}", "{gpu: Voodoo2}", "regions[1].device.gpu", "'Voodoo2'"),
    ("{slowdown: 4}", "{slowdown: 0}", "regions[2].device.slowdown", "0"),
    ("{slowdown: 4}", "{slowdown: -2}", "regions[2].device.slowdown", "-2"),
    ("memory_gb: 4}", "memory_gb: -4}", "regions[3].device.memory_gb", "-4"),
    ("{gpu: titan rtx}", "{gpu: T4, memory_gb: -1}", "regions[1].device.memory_gb", "-1"),
    ("{gpu: MyChip, peak_tflops: 10, memory_gb: 4}", "{gpu: MyChip, peak_tflops: 10}",
     "regions[3].device.memory_gb", "missing"),
    ("device: {gpu: V100}", "device: {gpu: V100, tflops: 3}", "device", "'tflops'"),
])
def test_bad_device_names_file_field_and_value(tmp_path, old, new, field, value):
    assert old in MIXED
    p = write(tmp_path, MIXED.replace(old, new, 1))
    with pytest.raises(ScenarioError) as e:
        load_scenario(str(p))
    msg = str(e.value)
    assert str(p) in msg and f"{field}:" in msg and value in msg and "\n" not in msg


def test_unknown_gpu_lists_the_known_ones(cli, tmp_path):
    p = write(tmp_path, MIXED.replace("{gpu: titan rtx}", "{gpu: Voodoo2}"))
    rc, out, err = cli("scenario", "show", p, "--no-plots")
    assert rc == 2 and err.count("\n") == 1 and all(g in err for g in REQUIRED)


def test_show_prints_type_memory_and_effective_speed(cli, tmp_path):
    rc, out, err = cli("scenario", "show", write(tmp_path, MIXED), "--no-plots")
    rows = {line.split()[0]: line for line in out.splitlines()[4:]}
    assert rc == 0, err
    assert "V100, 16 GB, 37.5 TFLOPS (125 x 0.3)" in rows["A"]
    assert "TITAN RTX, 24 GB, 39 TFLOPS (130 x 0.3)" in rows["B"]
    assert "V100, 16 GB, 9.38 TFLOPS (125 x 0.3 / 4)" in rows["C"]
