"""CocktailSGD (Wang et al., ICML 2023) and the map of which system wins where: `harness reproduce cocktail`.

CocktailSGD is DT-FM's authors' follow-up: the data-parallel exchange compressed by a random subset, top-k and
n-bit quantisation with error feedback (harness/compute/compression.py), "up to 117x", training "within 1.2x of a
data center over 500 Mbps". Its parts here: the codec's bytes (the formula beside an encoded message), the data
center against 500 Mbps (simulated at DT-FM's scale: GPT3-XL, batch 1024, 64 V100), the map of `harness sim report
--map` with the claims of the papers it can check, and the compressed runs trained for real on the world-wide case
(cocktail_emulated.py). No paper gives the harness a number to fit: the claims are checked, never used.
"""
from __future__ import annotations

from . import Context, Paper, Part, Setting, cocktail_emulated
from .claims import Claim, Section

MODEL, BATCH = "gpt3-xl", 1024  # DT-FM's model and batch (the map's)
SLOW = "cocktail-500mbps"  # case 1's nodes with 500 Mbps between them (scenarios/cocktail-500mbps.yaml)
CODECS = ("cocktail", "int8", "fp8")
ENCODED_VALUES = 1 << 20  # a shard of a million values, encoded by the runtime's codec
QUICK_MAP = (("1", "5"), (0.1, 1.0))  # scenarios x bandwidth scales of QUICK's map
SIM: dict = {}  # the simulator's settings over its defaults (SimSettings: ours' scheduler's budget, ...)
WHY_117 = ("the harness runs CocktailSGD's code defaults (random subset 0.5, top-k 0.5, 8 bits); the paper's 117x "
           "is its most aggressive setting, whose knobs are not quoted here")
WHY_500 = ("DT-FM's GPT3-XL over case 1's 64 V100 (scenarios/cocktail-500mbps.yaml), not the paper's models and "
           "cluster: at the code's defaults (12.5x, not 117x) the data-parallel exchange of a node's 8 GPUs, through "
           "its one 500 Mbps NIC, still outlasts their compute")


def wire(ctx: Context) -> list[Section]:
    """A codec's message of one shard: the formula's bytes (compute/compression.py, what the simulator and the
    scheduler charge) and the bytes the runtime's encoder put in a message of a random shard."""
    import torch

    from ..compute.compression import Compression
    from ..train.compression import ShardCodec

    m = ENCODED_VALUES
    s = Section("The codec's bytes on the wire", text=f"A shard of {m} fp32 values: its bytes (4 a value) over the "
                "codec's message, by the formula the simulator charges (simulated) and as the runtime's encoder "
                "wrote it for a shard of normal random values (measured).")
    rows = ["| codec | formula bytes | encoded bytes | fp32 over the message |", "|---|---|---|---|"]
    for text in CODECS:
        c = Compression.parse(text)
        formula = c.message_bytes(m)
        message, _ = ShardCodec(c, m).encode(torch.randn(m, generator=torch.Generator().manual_seed(0)), 0)
        encoded = message.numel() * message.element_size()
        rows.append(f"| `{c}` | {formula} | {encoded} | {4 * m / formula:.1f}x |")
        if text == "cocktail":
            s.add(Claim("Abstract", "CocktailSGD's compression of the exchange (fp32 bytes over the message's)",
                        "Abstract", paper=117.0, above=1.0, unit="x", why=WHY_117), 4 * m / formula,
                  measured=4 * m / encoded, note=f"`{c}`")
    s.text += "\n\n" + "\n".join(rows)
    return [s]


def slow_network(ctx: Context) -> list[Section]:
    """Ours (its own runtime) in case 1's data center against ours + cocktail and plain ours with 500 Mbps between
    the nodes, each at its best layout (the map's contenders)."""
    from ..report.map import CONTENDERS
    from ..sim.request import SimSettings

    settings = SimSettings(**SIM)
    by_label = {c.label: c for c in CONTENDERS}
    plain, coded = by_label["ours"], by_label["ours+cocktail"]
    ctx.progress(f"the data center (case 1) and {SLOW}: ours, ours + cocktail")
    seconds = {(scenario, c.label): _seconds(c, scenario, settings) for scenario in ("1", SLOW) for c in (plain, coded)}
    s = Section("Abstract: within 1.2x of a data center over 500 Mbps",
                text=f"Seconds an iteration ({MODEL}, batch {BATCH}, each at its best layout), case 1's data center "
                     f"and `{SLOW}` (the same nodes with 500 Mbps between them):\n\n"
                     "| network | ours | ours + cocktail |\n|---|---|---|\n" +
                     "\n".join(f"| {name} | {seconds[(sc, 'ours')]:.2f} | {seconds[(sc, 'ours+cocktail')]:.2f} |"
                               for sc, name in (("1", "case 1 (25 Gbps between nodes)"), (SLOW, "500 Mbps"))))
    s.add(Claim("Abstract", "over 500 Mbps, compressed training within 1.2x of the data center (ours + cocktail at "
                "500 Mbps over plain ours in case 1, seconds an iteration)", "Abstract", below=1.2, unit="x",
                why=WHY_500), seconds[(SLOW, "ours+cocktail")] / seconds[("1", "ours")])
    s.add(Claim("Abstract", "over 500 Mbps, compression speeds training up (plain ours over ours + cocktail)",
                "Sec. 1", above=1.0, unit="x"), seconds[(SLOW, "ours")] / seconds[(SLOW, "ours+cocktail")],
          note=f"plain ours at 500 Mbps: {seconds[(SLOW, 'ours')] / seconds[('1', 'ours')]:.2f}x its data center's")
    return [s]


def _seconds(contender, scenario: str, settings) -> float:
    from ..errors import HarnessError
    from ..report.map import simulate_contender

    _, _, best = simulate_contender(contender, scenario, 1.0, settings, MODEL, BATCH)
    if best is None:
        raise HarnessError(f"reproduce cocktail: {contender.label} has no layout on {scenario}")
    return best.seconds


def the_map(ctx: Context) -> list[Section]:
    """`harness sim report --map`'s sweep into map/, and the claims of the papers it can check."""
    from ..report.map import MAP_SCALES, MAP_SCENARIOS, sweep_map, write_map
    from ..sim.request import SimSettings

    scenarios, scales = QUICK_MAP if ctx.quick else (MAP_SCENARIOS, MAP_SCALES)
    ctx.progress(f"the map: {len(scenarios)} scenarios x {len(scales)} bandwidth scales, every contender")
    cells = sweep_map(scenarios, scales, settings=SimSettings(**SIM))
    write_map(ctx.out / "map", cells, "reproduce-cocktail")
    ctx.found["map"] = cells
    s = Section("The map: which system wins where", plots=["map/map.png"],
                text="Every contender at its best layout, simulated at paper scale over the scenarios x bandwidth "
                     "scales (`harness sim report --map`; the table, map.csv and the codec's gain in "
                     "[map/report.md](map/report.md)). The claims the papers make about where each wins, checked on "
                     "it; throughput is not convergence (the points part measures the samples to the loss).")
    by = {(c.scenario, c.scale): c for c in cells}
    lowest, one = min(scales), 1.0 if 1.0 in scales else max(scales)
    world = by.get(("5", one))
    if world is not None:
        tput = world.samples_per_s
        dtfm, fastest = tput.get("dtfm"), max(tput.get("megatron", 0.0), tput.get("deepspeed", 0.0))
        if dtfm and fastest:
            s.add(Claim("DT-FM Fig. 3c", f"world-wide (case 5, x{one:g}): DT-FM's scheduled runtime over the faster "
                        "of Megatron and DeepSpeed (throughput)", "DT-FM Sec. 4.2", above=1.0, unit="x"),
                  dtfm / fastest)
        if _gain(world):
            s.add(Claim("Map", f"world-wide (case 5, x{one:g}): compression speeds ours up (ours + cocktail over "
                        "ours, throughput)", "Sec. 1", above=1.0, unit="x"), _gain(world))
    gains = [(sc, _gain(by.get((sc, lowest))) / _gain(by.get((sc, one)))) for sc in scenarios
             if _gain(by.get((sc, lowest))) and _gain(by.get((sc, one))) and lowest < one]
    if gains:
        sc, worst = min(gains, key=lambda g: g[1])
        s.add(Claim("Map", f"compression gains more the slower the links (ours + cocktail over ours at x{lowest:g} "
                    f"over the same at x{one:g}; the smallest over the scenarios)", "Sec. 1", above=1.0, unit="x"),
              worst, note=f"scenario {sc}")
    slow = [(sc, _low_comm(by.get((sc, lowest)))) for sc in scenarios if _low_comm(by.get((sc, lowest)))]
    if slow:
        sc, worst = min(slow, key=lambda g: g[1])
        s.add(Claim("Map", f"on the slowest links (x{lowest:g}) DiLoCo-style training is faster than every "
                    "synchronous system (the faster DiLoCo over the fastest other; the smallest over the scenarios)",
                    "DiLoCo Sec. 1", above=1.0, unit="x"), worst, note=f"scenario {sc}")
    return [s]


def _gain(cell) -> float | None:
    """The codec's throughput over plain ours' in the cell (None where either is missing)."""
    t = {} if cell is None else cell.samples_per_s
    coded, plain = t.get("ours+cocktail"), t.get("ours")
    return coded / plain if coded and plain else None


def _low_comm(cell) -> float | None:
    """The fastest DiLoCo-style contender's throughput over the fastest other's in the cell."""
    from ..report.map import CONTENDERS, syncs_every_h_steps

    if cell is None:
        return None
    system = {c.label: c.system for c in CONTENDERS}
    h_steps = [v for k, v in cell.samples_per_s.items() if syncs_every_h_steps(system[k])]
    others = [v for k, v in cell.samples_per_s.items() if not syncs_every_h_steps(system[k])]
    return max(h_steps) / max(others) if h_steps and others else None


SETTINGS = (
    Setting("the slow network", "case 1's 8 nodes x 8 V100 with each node's NIC at 500 Mbps "
            "(scenarios/cocktail-500mbps.yaml)", "the paper's cluster is not at hand; only the link changes"),
    Setting("the codec", "CocktailSGD's code defaults: random subset 0.5, top-k 0.5, 8 bits, buckets of 128, "
            "error feedback (DS3Lab/CocktailSGD)", "the paper tunes its ratios per run"),
    Setting("the exchange", "synchronous, after each replica's own step (CocktailSGD runs it beside the next step, "
            "one step stale)", "harness/compute/compression.py's docstring names the differences"),
    Setting("the model", f"{MODEL}, batch {BATCH} at paper scale (DT-FM's); the emulated runs: the micro GPT's 4 "
            "blocks on markov tokens", "the paper fine-tunes larger models; the floor of markov data is known"),
)

PAPER = Paper(
    "cocktail", "CocktailSGD (Wang et al., ICML 2023) and the map of which system wins where",
    "Wang et al., CocktailSGD, ICML 2023 (PMLR 202), code DS3Lab/CocktailSGD (not one of the seeds)",
    "DT-FM's authors' follow-up compresses the data-parallel exchange (random subset, top-k, n-bit quantisation, "
    "error feedback) to train over slow links; here ours' exchange under its codec, int8 and fp8, against every "
    "other system of the harness over the scenarios and a sweep of bandwidth.",
    parts=(Part("wire", "the codec's bytes: the formula beside an encoded message", 2, wire),
           Part("slow-network", "the data center against 500 Mbps (simulated)", 20, slow_network),
           Part("map", "the map: every scenario x bandwidth scale, every contender (simulated; QUICK: cases 1 and 5 "
                "at x0.1 and x1)", 450, the_map, quick_seconds=40),
           Part("emulated", "case 5 at 8 devices, trained for real to the loss floor + 10 %: ours, ours + cocktail, "
                "ours + int8 (QUICK: a few iterations each, no convergence)", cocktail_emulated.SECONDS,
                cocktail_emulated.emulated, quick_seconds=cocktail_emulated.QUICK_SECONDS, measured=True),
           Part("points", "the map's points, trained for real on loopback to the loss floor + 10 %: each point's "
                "fastest contenders", cocktail_emulated.POINT_SECONDS, cocktail_emulated.points, measured=True,
                in_quick=False)),
    settings=SETTINGS,
)
