"""The `graphc` command line: `graphc ops [--markdown]` lists the op registry."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="graphc", description="graphc command line")
    sub = parser.add_subparsers(dest="command", required=True)
    ops = sub.add_parser("ops", help="list every op in the registry and where its rules live")
    ops.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args(argv)
    if args.command == "ops":
        from graphc.ops.__main__ import print_ops

        print_ops(markdown=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
