"""`python -m reports` is `python -m reports.build`."""

import sys

from reports.build import main

sys.exit(main())
