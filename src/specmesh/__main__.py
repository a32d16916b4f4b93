"""`python -m specmesh`: the `specmesh` command."""

import sys

from specmesh.host.cli import main

sys.exit(main())
