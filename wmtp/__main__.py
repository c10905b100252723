"""``python -m wmtp``: the ``wmtp`` command (wmtp/cli.py) from a checkout that is not pip-installed."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m wmtp"))
