"""`python -m host.cli`."""

import sys

from host.cli import main

sys.exit(main())
