"""argparse value types of the harness's flags: each turns one flag's text into a value, or refuses it in one
line that says what it must be (the CLI prints `harness CMD: error: --flag: ...`)."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from ..compute.compression import Compression, CompressionError
from ..scenario import ScenarioError, resolve_scenario


def flag_dest(flag: str) -> str:
    """The argparse attribute of `--a-flag`: a_flag."""
    return flag[2:].replace("-", "_")


def _integer_from(lowest: int, wanted: str):
    """An argparse type: an integer >= `lowest`; its refusal says `wanted`."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = lowest - 1
        if v < lowest:
            raise argparse.ArgumentTypeError(f"must be {wanted} (got {text!r})")
        return v
    return parse


positive_int = _integer_from(1, "a positive integer")  # argparse type: an integer >= 1
non_negative_int = _integer_from(0, "an integer >= 0")  # argparse type: a seed, a count that may be none


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0 (got {text!r})") from None
    if not (v > 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a number > 0 (got {text!r})")
    return v


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0 (got {text!r})") from None
    if not (v >= 0 and v != float("inf")):
        raise argparse.ArgumentTypeError(f"must be a number >= 0 (got {text!r})")
    return v


def number_in(low: float, high: float, *, low_open: bool = False, high_open: bool = False):
    """An argparse type: a number in the interval from `low` to `high` (`low_open`/`high_open`: the bound
    itself excluded), e.g. a learning rate in (0, 1]; `.bounds` says which (what tests draw bad values from)."""
    shown = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        inside = (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
        if not inside:  # NaN is never inside
            raise argparse.ArgumentTypeError(f"must be a number in {shown} (got {text!r})")
        return v

    parse.bounds = (low, high, low_open, high_open)
    return parse


def nonempty(text: str) -> str:
    """argparse type: a name or a value that is not empty (an empty one would silently mean the default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"must not be empty (got {text!r})")
    return text


def one_of(*names: str):
    """An argparse type: one of `names` (as `choices=`, for a type that travels without its parser: a system's
    Option)."""
    def parse(text: str) -> str:
        if text not in names:
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(names)} (got {text!r})")
        return text
    return parse


def codec_text(text: str) -> str:
    """argparse type of a data-parallel codec with its settings (compute/compression.py): its canonical text."""
    try:
        return str(Compression.parse(text, where=""))
    except CompressionError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def name_list(text: str) -> tuple[str, ...]:
    """argparse type: names, comma-separated, none empty."""
    names = tuple(x.strip() for x in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"must be names, comma-separated, none empty (got {text!r})")
    return names


def fractions(text: str) -> list[float]:
    """argparse type: numbers in (0, 1], comma-separated (OWL's alpha)."""
    try:
        vals = [float(x) for x in text.split(",")]
    except ValueError:
        vals = []
    if not vals or not all(0 < v <= 1 for v in vals):
        raise argparse.ArgumentTypeError(f"must be numbers in (0, 1], comma-separated (got {text!r})")
    return vals


_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def byte_sizes(text: str) -> tuple[int, ...]:
    """argparse type: sizes in bytes, comma-separated, each an integer >= 1 with an optional K, M or G
    (KiB, MiB, GiB): 64K,4M."""
    out = []
    for x in text.split(","):
        x = x.strip().upper()
        unit = x[-1:] if x[-1:] in _SIZE_UNITS else ""
        digits = x[:len(x) - len(unit)]
        if not digits.isdigit() or int(digits) < 1:
            raise argparse.ArgumentTypeError(f"must be sizes such as 64K,4M (bytes, K/M/G binary), comma-separated "
                                             f"(got {text!r})")
        out.append(int(digits) * _SIZE_UNITS[unit])
    return tuple(out)


def seconds_list(text: str) -> tuple[float, ...]:
    """argparse type: durations in seconds >= 0, comma-separated."""
    try:
        vals = tuple(float(x) for x in text.split(","))
    except ValueError:
        vals = ()
    if not vals or not all(0 <= v < math.inf for v in vals):
        raise argparse.ArgumentTypeError(f"must be seconds >= 0, comma-separated (got {text!r})")
    return vals


def scenario_name(text: str) -> str:
    """argparse type: a case number, a scenario's name or a path to a scenario file that exists (its content
    is checked when it is loaded)."""
    try:
        resolve_scenario(text)
    except ScenarioError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def input_file(text: str) -> Path:
    """argparse type: a file that exists and can be read (its content is checked where it is parsed)."""
    p = Path(text)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: a directory, not a file")
    if not os.access(p, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: not readable")
    return p


def input_path(text: str) -> Path:
    """argparse type: a file or a directory that exists (records: a CSV, or a directory searched for them)."""
    p = Path(text)
    if not p.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file or directory")
    return p


def input_dir(text: str) -> Path:
    """argparse type: a directory that exists (of runs, of results)."""
    p = Path(text)
    if not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {'not a directory' if p.exists() else 'no such directory'}")
    return p


def _writable_below(p: Path, text: str) -> None:
    """The nearest existing ancestor of `p` is a directory this process may write into."""
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: {parent} is not writable")


def output_file(text: str) -> Path:
    """argparse type: a file to write (`--json`, `--csv`): not a directory, in a place that can be written."""
    p = Path(text)
    if not text or p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: a directory, not a file to write" if text else "empty path")
    if p.exists() and not os.access(p, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: not writable")
    _writable_below(p, text)
    return p


def output_dir(text: str) -> Path:
    """argparse type: a directory to write into (`--out`): a directory or nothing yet, in a place that can
    be written."""
    p = Path(text)
    if not text:
        raise argparse.ArgumentTypeError("empty path")
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: exists and is not a directory")
    if p.is_dir():
        if not os.access(p, os.W_OK | os.X_OK):
            raise argparse.ArgumentTypeError(f"{text}: not writable")
    else:
        _writable_below(p, text)
    return p
