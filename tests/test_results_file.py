"""experiments.common.write_results: the record every benchmark writes under results/."""
from __future__ import annotations

import json
import os

import pytest

from experiments.common import git_rev, write_results


def test_record_carries_config_revision_and_machine_load(tmp_path):
    path = write_results("bench_x", {"rows": [{"a": 1.5}], "seed": 3}, config={"k": 2}, results_dir=tmp_path)
    rec = json.loads(path.read_text())
    assert path == tmp_path / "bench_x.json"
    assert rec["rows"] == [{"a": 1.5}] and rec["config"] == {"k": 2} and rec["seed"] == 3
    assert rec["git_rev"] == git_rev()
    env = rec["env"]
    assert env["cpu_count"] == os.cpu_count() and env["xla_flags"] == os.environ.get("XLA_FLAGS", "")
    load = env["loadavg_1_5_15"]
    assert len(load) == 3 and all(isinstance(x, float) and x >= 0 for x in load)


@pytest.mark.parametrize("name", ["", "a/b", "..\\x"])
def test_bad_stem_is_one_clear_error(tmp_path, name):
    with pytest.raises(ValueError, match="plain file stem"):
        write_results(name, {}, results_dir=tmp_path)
