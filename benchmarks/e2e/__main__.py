"""`python3 -m benchmarks.e2e`: see benchmarks/e2e/driver.py."""

from benchmarks.e2e.driver import main

main()
