"""`python -m specmesh.host.cli`."""

import sys

from specmesh.host.cli import main

sys.exit(main())
