"""`python -m raggedvit.cli`: the same as `python -m raggedvit`."""

from raggedvit.cli import main

if __name__ == "__main__":
    main()
