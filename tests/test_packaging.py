"""`pip install .` (not editable) ships every package and every data file the code reads.

Read from pyproject.toml with setuptools' own package finder, as the wheel build does: a folder
of our packages without ``__init__.py`` (silently left out of the wheel), a package that the
include patterns miss, or a data file (checkpoints, resharding tables) that no package-data glob
matches would make `shardgym train` / `shardgym plan` fail outside a clone. Nothing is built, so
it runs in well under a second. The install itself was checked by hand (see README, "Install").
"""
import fnmatch
import os
import subprocess
import tomllib

import setuptools

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("zoo", "costmodel", "solvers", "env", "agent", "runtime", "shardgym")


def _config():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _tracked(top: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", top], cwd=ROOT, capture_output=True, text=True)
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.split()
    return [os.path.relpath(os.path.join(d, f), ROOT) for d, _, fs in os.walk(os.path.join(ROOT, top)) for f in fs
            if "__pycache__" not in d]


def test_every_package_folder_is_in_the_wheel():
    found = set(setuptools.find_packages(where=ROOT, include=_config()["packages"]["find"]["include"]))
    for top in PACKAGES:
        dirs = {os.path.dirname(p) for p in _tracked(top) if p.endswith(".py")}
        for d in sorted(dirs):
            name = d.replace(os.sep, ".")
            assert name in found, f"{d}/ holds Python files but is not a package of the wheel (no __init__.py?)"


def test_every_data_file_is_package_data():
    globs = _config()["package-data"]
    for top in PACKAGES:
        for path in _tracked(top):
            if path.endswith(".py"):
                continue
            rel = os.path.relpath(path, top)
            assert any(fnmatch.fnmatch(rel, g) for g in globs.get(top, [])), \
                f"{path} is not matched by [tool.setuptools.package-data] {top} = {globs.get(top)}"
    assert any(p.endswith("policy.msgpack") for p in _tracked("agent"))   # the checks above saw the data
