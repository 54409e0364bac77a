"""`python -m fabriclab` = `fabriclab`."""

import sys

from fabriclab.launch import run

sys.exit(run())
