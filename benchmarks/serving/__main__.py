"""`python3 -m benchmarks.serving`: see benchmarks/serving/driver.py."""

import sys

from benchmarks.serving.driver import main

sys.exit(main())
