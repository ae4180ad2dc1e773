import sys

from benchmarks.serve_load.run import main

sys.exit(main())
