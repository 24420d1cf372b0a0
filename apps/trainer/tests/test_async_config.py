"""`async.max_staleness` and `async.partial_rollout`: keys of every recipe, synchronous only.

The asynchronous pipeline (issue #30, items 3-4) is not built, so any other value is refused in
one line rather than accepted and ignored; colocated placement can only ever overlap partial
rollouts, which is its own line.
"""

from __future__ import annotations

import json

import pytest

from rstar2_trainer.cli import main
from rstar2_trainer.config import ConfigError, TrainerConfig, load_config, recipes

COLOCATED = {"gpu-1", "node-8gpu", "qwen3-14b-mi300x", "sft-paper"}


def test_every_recipe_takes_the_synchronous_values_and_writes_them_back():
    for name in recipes():
        config = load_config(name, ["async.max_staleness=0", "async.partial_rollout=false"])
        written = json.loads(config.model_dump_json())  # config.yaml, as --resume reads it
        assert written["async"] == {"max_staleness": 0, "partial_rollout": False}
    written = json.loads(load_config("tiny").model_dump_json())
    assert TrainerConfig.model_validate(written) == load_config("tiny")


@pytest.mark.parametrize("name", sorted(recipes()))
def test_asynchronous_values_are_refused_in_one_line(name, capsys):
    argv = [name, "--dry-run", "async.max_staleness=2"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    if name in COLOCATED:
        assert (
            "async.max_staleness > 0 with cluster.colocate needs async.partial_rollout: true" in err
        )
    else:
        assert "async.max_staleness > 0 is not implemented yet" in err
    assert main([name, "--dry-run", "async.max_staleness=2", "async.partial_rollout=true"]) == 2
    assert "async.max_staleness > 0 is not implemented yet" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"async\.partial_rollout is not implemented yet"):
        load_config(name, ["async.partial_rollout=true"])


def test_the_colocated_recipes_are_the_ones_that_colocate():
    colocated = {n for n in recipes() if (c := load_config(n).cluster) and c.colocate}
    assert colocated == COLOCATED


def test_a_negative_staleness_is_a_type_error(capsys):
    assert main(["--dry-run", "async.max_staleness=-1"]) == 2
    assert "async.max_staleness: Input should be greater than or equal to 0" in (
        capsys.readouterr().err
    )
