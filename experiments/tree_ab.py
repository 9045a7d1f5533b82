"""The two-tree protocol of the A/B scripts that compare a base checkout with this one, one after the other
(experiments/s25b_jitted_decode.py, experiments/s27b_heldout_default_ab.py): run with ``--rows-json PATH`` in the
base tree (its modules first on sys.path: the current directory), the script writes its rows there; run here with
``--before PATH``, it reads them back beside this tree's. Imported by plain name (``import tree_ab``: the
script's own directory is on sys.path in either tree)."""
from __future__ import annotations

import argparse
import json
import os
import sys


def parse(doc: str, root: str, extra=None) -> argparse.Namespace:
    """The script's arguments (``--rows-json``, ``--before`` and what ``extra(ap)`` adds), with the tree whose
    modules run first on sys.path: the current directory with ``--rows-json``, else ``root`` (this checkout)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--rows-json", default="")
    ap.add_argument("--before", default="")
    if extra is not None:
        extra(ap)
    args = ap.parse_args()
    sys.path.insert(0, os.getcwd() if args.rows_json else root)
    return args


def rows_or_before(args: argparse.Namespace, rows) -> dict | None:
    """With ``--rows-json``: ``rows()`` written there, None returned (the base tree's run ends). Else the base
    tree's rows, read from ``--before``."""
    if args.rows_json:
        with open(args.rows_json, "w") as f:
            json.dump(rows(), f, indent=1)
        return None
    with open(args.before) as f:
        return json.load(f)
