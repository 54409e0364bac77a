"""`python -m controller.cli` = `fabriclab`."""

import sys

from controller.cli import main

sys.exit(main())
