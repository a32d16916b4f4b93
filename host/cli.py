"""The `specmesh` command line: parses arguments and dispatches to the host's subsystems."""

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="specmesh", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    from host import runner

    runner.add_arguments(sub.add_parser("run", help="generate text: speculative decoding across boards"))
    args = parser.parse_args(argv)
    if args.command == "run":
        return runner.main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
