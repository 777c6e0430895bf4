"""batch-predict's settings: pipeline.yaml's batch: section, the command line over it, bad values named."""

from __future__ import annotations

import pytest

from vitdeploy.base.config import parse_config
from vitdeploy.base.errors import ConfigError
from vitdeploy.batch.job import batch_settings_from_config


def test_the_command_line_overrides_the_batch_section_which_overrides_the_defaults(tmp_path):
    cfg = parse_config(
        {
            "batch": {"workers": 3, "gpus_per_worker": 0.5, "cache_dir": "cache"},
            "runtime": {"backend": "ort", "top_k": 2},
        },
        tmp_path / "pipeline.yaml",
    )
    s = batch_settings_from_config(cfg, ["a/"], artifacts=None, output="o.jsonl", workers=None, top_k=4, resume=True)
    assert (s.workers, s.gpus_per_worker, s.backend, s.top_k, s.resume) == (3, 0.5, "ort", 4, True)
    assert s.cache_dir == str(tmp_path / "cache") and s.artifacts == str(tmp_path / "artifacts")
    assert s.batch_size is None and s.decode_cpus == 1.0  # None: the export's opt, read from the manifest


@pytest.mark.parametrize(
    "key, value", [("workers", 0), ("decode_cpus", 0), ("flush_seconds", -1), ("batch_size", 0), ("threads", 2)]
)
def test_a_bad_batch_key_is_one_error_naming_it(key, value):
    with pytest.raises(ConfigError, match=rf"batch\.{key}"):
        parse_config({"batch": {key: value}})
