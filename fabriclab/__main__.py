"""`python -m fabriclab` = `fabriclab`."""

import sys

from fabriclab.cli import main

sys.exit(main())
