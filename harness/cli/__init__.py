"""`harness ...`: a thin layer that parses, calls the library, and prints.

Every module in this package that defines `register(subparsers)` adds its own
sub-commands, so features add their CLI without editing a shared file. A
`HarnessError` becomes one line on stderr and exit status 2; never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from ..errors import HarnessError
from ..plan.flags import positive_float, positive_int  # noqa: F401  (the argparse types of every command)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harness",
        description="Network-emulation benchmarking harness for decentralized training of foundation models.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for mod in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{mod.name}")
        if hasattr(module, "register"):
            module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        rc = args.func(args)
    except HarnessError as e:
        print(f"harness: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("harness: interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
