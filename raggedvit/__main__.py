"""`python -m raggedvit ...`: the raggedvit command line (the console entry point `raggedvit`)."""

from raggedvit.cli import main

if __name__ == "__main__":
    main()
