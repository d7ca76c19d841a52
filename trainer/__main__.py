"""``python -m trainer ...``: the same command line as the ``trainer`` console script."""
import sys

from trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
