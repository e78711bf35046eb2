"""`python -m sweeps NAME ...` is `python -m sweeps.run NAME ...`."""

import sys

from sweeps.run import main

sys.exit(main())
