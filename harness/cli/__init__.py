"""`harness ...`: a thin layer that parses, calls the library, and prints.

Every module in this package that defines `register(subparsers)` adds its own
sub-commands, so features add their CLI without editing a shared file. A refused
flag or a `HarnessError` becomes one line on stderr and exit status 2; a file that
cannot be read or written is one line naming it; a closed pipe ends quietly; a bug
is one line saying where its traceback was saved. Never a traceback on the terminal.
"""
from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import tempfile
import traceback

from ..errors import HarnessError
# the argparse types and helpers of every command
from ..plan.arg_types import (byte_sizes, fractions, input_dir, input_file, input_path, name_list,  # noqa: F401
                              non_negative_int, nonempty, output_dir, output_file, positive_float, positive_int,
                              scenario_name, seconds_list)
from .run_flags import add_alias, add_results_argument, add_transport_argument  # noqa: F401
from ..scenario.transport import PRESETS, with_preset


def transport_of(args):
    """The Transport `--transport` asks for, or None: the scenario's own."""
    return None if getattr(args, "transport", "scenario") == "scenario" else PRESETS[args.transport]


def with_transport(topo, args):
    """`topo` with the TCP settings `--transport` asks for in place of its own."""
    return with_preset(topo, getattr(args, "transport", "scenario"))


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `harness sim: error: ...` and where to read more, not a usage block."""

    def parse_known_args(self, args=None, namespace=None):
        self._tokens = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message):
        message = self._unknown_option(message) or message
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)

    def _unknown_option(self, message: str) -> str | None:
        """argparse reads `--tp 2` after an option it does not know as an unknown subcommand `2`: say what
        happened instead."""
        subs = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
        if subs is None or "invalid choice" not in message:
            return None
        tokens = getattr(self, "_tokens", [])
        known = {o for a in self._actions for o in a.option_strings}
        unknown = [t for t in tokens if t.startswith("-") and t.split("=", 1)[0] not in known]
        if unknown:
            return f"unrecognized arguments: {' '.join(unknown)}"
        return None


def _version() -> str:
    from importlib.metadata import version

    from ..results import git_commit

    commit = git_commit()
    return f"harness {version('harness')}" + (f" (commit {commit[:12]})" if commit else "")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="harness",
        description="Network-emulation benchmarking harness for decentralized training of foundation models.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{mod.name}")
        if hasattr(module, "register"):
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:  # a refused flag (its line printed), --help or --version: the exit status
            return e.code if isinstance(e.code, int) else 0
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a closed pipe is caught, not in the interpreter's exit
        return rc
    except HarnessError as e:
        print(f"harness: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `harness ... | head`: the reader left; say nothing more
        _quiet_stdout()
        return 141
    except OSError as e:
        if e.filename is None:
            return _bug()
        print(f"harness: error: {e.filename}: {e.strerror}", file=sys.stderr)
        return 2
    except Exception:  # a bug: one line, the traceback kept in a file
        return _bug()


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's own flush at exit does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _bug() -> int:
    exc = sys.exc_info()[1]
    fd, path = tempfile.mkstemp(prefix="harness-traceback-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        f.write(traceback.format_exc())
    print(f"harness: internal error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
          f"(a bug; traceback in {path})", file=sys.stderr)
    return 70


if __name__ == "__main__":
    sys.exit(main())
