"""Command line of the benchmarks: run all sections or the ones named, optionally write JSON."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

from specmesh.tools import output_problem, run_tool
from specmesh.host import atomic
from specmesh.host.cli.flags import a_path
from specmesh.host.cli.streams import StdoutLost
from specmesh.host.layout import MODELS
from specmesh.tools.bench import sections
from specmesh.tools.bench._report import noise_lines


def report_problem(folder: Path) -> str | None:
    """Why the plots and report.md cannot go into `folder` (made when they are written), or None."""
    above = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    if not above.is_dir():
        return "%s is a file, not a folder" % above
    return None if os.access(above, os.W_OK | os.X_OK) else "no permission to write in %s" % above


def main(argv: list[str] | None = None) -> int:
    names = sections()
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.bench", description="specmesh benchmarks")
    ap.add_argument("section", nargs="*", help="sections to run (default: all): " + ", ".join(names))
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON to FILE")
    ap.add_argument("--report", metavar="DIR", type=a_path, default=Path("runs/bench"),  # '': not the current folder
                    help="write PNG plots and report.md there (default: %(default)s; needs matplotlib)")
    args = ap.parse_args(argv)
    unknown = [s for s in args.section if s not in names]
    if unknown:
        print("bench: error: unknown benchmark section %s (available: %s)" % (", ".join(unknown), ", ".join(names)),
              file=sys.stderr)
        return 2
    # the outputs checked before the sections' minutes of work: `--json ''` is no file, --report a folder, --json a
    # file of the shipped models folder, which the sections read
    for flag, problem in (("--json", args.json is not None and output_problem(args.json, MODELS.glob("*"))),
                          ("--report", report_problem(args.report))):
        if problem:
            print("bench: error: %s %s cannot be written: %s" % (flag, getattr(args, flag[2:]) or "''", problem),
                  file=sys.stderr)
            return 2
    results: dict = {"machine": {"python": platform.python_version(), "platform": platform.platform(),
                                 "processor": platform.processor() or platform.machine()},
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    failed = []
    for name in args.section or names:
        print("== %s ==" % name, flush=True)
        t0 = time.perf_counter()
        try:
            results[name] = importlib.import_module("specmesh.tools.bench." + name).run()
        except (KeyboardInterrupt, BrokenPipeError, StdoutLost):  # stopped, stdout gone or full: no section's failure
            raise
        except Exception as e:  # noqa: BLE001 - one section failing must not lose the others' figures
            print("bench: error: section %s failed: %s: %s" % (name, type(e).__name__, e), file=sys.stderr)
            results[name] = {"error": "%s: %s" % (type(e).__name__, e)}
            failed.append(name)
        print("(%s: %.1f s)\n" % (name, time.perf_counter() - t0), flush=True)
    for line in noise_lines(results):
        print(line)
    if args.json is not None:
        try:  # the Unix way: a device or a FIFO is written to, never replaced by a file
            atomic.write_output(args.json, json.dumps(results, indent=2) + "\n")
            print("figures written to %s" % args.json)
        except OSError as e:
            print("bench: error: cannot write %s: %s" % (args.json, e.strerror), file=sys.stderr)
            failed.append("--json")
    try:
        from specmesh.tools.bench._report import write

        files = write(results, args.report)
        print("plots and report written: %s" % ", ".join(str(f) for f in files))
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install 'specmesh[bench]', or make bench)")
    return 1 if failed else 0


if __name__ == "__main__":
    run_tool("bench", main)
