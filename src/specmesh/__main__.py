"""`python -m specmesh`, and the target of the `specmesh` console script (pyproject.toml): the `specmesh` command,
a Ctrl-C quiet from its first statement (host/quiet.py, from `import specmesh`), before its modules import."""

import sys

from specmesh.host import quiet


def main() -> int:
    """The `specmesh` command's exit status."""
    quiet.quiet_until_it_runs(sys.argv)  # (already, where the console script or -m imported specmesh: a caller's own)
    from specmesh.host.cli import main as command  # imported only now, a Ctrl-C in its imports quiet

    return command()


if __name__ == "__main__":
    sys.exit(main())
