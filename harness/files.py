"""Reading and writing the harness's files: one-line errors on read, atomic writes with the user's umask.

A reader sees the old file or the whole new one, never half of it; a file the user gives that is a directory,
missing, unreadable or binary is one HarnessError naming it, never a traceback.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

from .errors import HarnessError


def read_text(path: Path, what: str = "file") -> str:
    """The text of `path`; a one-line HarnessError if it is missing, a directory, unreadable or not UTF-8 text
    (`what` says what was expected, e.g. "scenario YAML")."""
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        raise HarnessError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise HarnessError(f"{path}: a directory, not a {what}") from None
    except UnicodeDecodeError:
        raise HarnessError(f"{path}: not a text file (a {what} was expected)") from None
    except OSError as e:
        raise HarnessError(f"{path}: cannot read ({e.strerror})") from None


def _umask() -> int:
    """The process's umask (read without changing it where /proc says it)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: Path, mode: int = 0o666):
    """Yield a temporary path beside `path` for a writer that wants a file name (a figure's savefig); on
    success it becomes `path` with `mode` less the umask, on failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix or ".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, mode & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str, mode: int = 0o666) -> None:
    """Write `text` to `path` so that readers see the old file or the whole new one; the file gets `mode`
    less the umask, as `open()` would give it (mkstemp alone would leave it 0600)."""
    with atomic_path(path, mode) as tmp, open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
