"""The `specmesh` command line: parses arguments and dispatches to the host's subsystems."""

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specmesh", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("run", help="generate text across boards (not built yet: prints the plan)")
    args = parser.parse_args(argv)
    if args.command == "run":
        print("specmesh run: will start virtual boards, flash drafter and verifier, and generate text "
              "with the shipped models (the emulated cluster is not built yet).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
