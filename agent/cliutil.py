"""The command-line error contract shared by ``shardgym`` and ``shardgym train``: an argparse parser
whose errors are one ``shardgym: error:`` line and exit status 2. Kept free of heavy imports (no
jax, no flax), so that ``shardgym iopddl`` starts in a fraction of a second."""
from __future__ import annotations

import argparse
import sys


class OneLineParser(argparse.ArgumentParser):
    """argparse with the CLI's error contract: one ``shardgym: error:`` line, exit 2."""

    def error(self, message):
        print(f"shardgym: error: {self.prog}: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(2)
