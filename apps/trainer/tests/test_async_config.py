"""`async.max_staleness`, `async.partial_rollout` and `async.at_push`: keys of every recipe;
partial rollouts and one-step-off steps (staleness alone) run with local engines, in split
placement and colocated, and what is not built is refused in one line rather than accepted and
ignored: either on remote services, and partial rollouts with no staleness allowed.
`async.at_push: abort` reaches every vLLM engine the run builds, and is refused where no engine
would abort (a synchronous run, a transformers engine, an engine set to wait).
"""

from __future__ import annotations

import json

import pytest

from rstar2_trainer.cli import main
from rstar2_trainer.config import ConfigError, TrainerConfig, load_config, recipes

COLOCATED = {
    "gpu-1",
    "node-8gpu",
    "qwen3-14b-mi300x",
    "qwen3-14b-lora-1gpu",
    "qwen3-8b-lora-1gpu",
    "sft-paper",
}
PARTIAL = ["async.max_staleness=2", "async.partial_rollout=true"]


def test_every_recipe_takes_the_synchronous_values_and_writes_them_back():
    for name in recipes():
        config = load_config(name, ["async.max_staleness=0", "async.partial_rollout=false"])
        written = json.loads(config.model_dump_json())  # config.yaml, as --resume reads it
        assert written["async"] == {"max_staleness": 0, "partial_rollout": False, "at_push": "wait"}
    written = json.loads(load_config("tiny").model_dump_json())
    assert TrainerConfig.model_validate(written) == load_config("tiny")


@pytest.mark.parametrize("name", sorted(recipes()))
def test_one_step_off_is_taken_and_what_is_not_built_is_refused_in_one_line(name, capsys):
    assert main([name, "--dry-run", "async.max_staleness=2"]) == 0  # one-step-off
    capsys.readouterr()
    written = json.loads(load_config(name, ["async.max_staleness=1"]).model_dump_json())
    assert written["async"] == {"max_staleness": 1, "partial_rollout": False, "at_push": "wait"}
    with pytest.raises(ConfigError, match=r"async\.partial_rollout needs async\.max_staleness"):
        load_config(name, ["async.partial_rollout=true"])
    if name in COLOCATED:
        assert main([name, "--dry-run", *PARTIAL]) == 0  # colocated: partial rollouts only
        capsys.readouterr()
        split = load_config(name, [*PARTIAL, "cluster.colocate=false"])  # split placement
        assert split.async_.partial_rollout and split.cluster and not split.cluster.colocate


@pytest.mark.parametrize("name", sorted(recipes()))
def test_partial_rollouts_are_taken_in_every_recipe_and_written_back(name):
    """Written back as `--resume` reads config.yaml: every field, defaults included (a colocated
    recipe's written `cluster.engines_per_node: 1` was once refused on the way back)."""
    config = load_config(name, PARTIAL)
    written = json.loads(config.model_dump_json())
    assert written["async"] == {"max_staleness": 2, "partial_rollout": True, "at_push": "wait"}
    assert TrainerConfig.model_validate(written) == config
    if config.cluster is None:  # a cluster recipe takes no remote section at all
        for steps in (PARTIAL, ["async.max_staleness=1"]):
            with pytest.raises(ConfigError, match=r"remote rollout services is not implemented"):
                load_config(name, [*steps, "remote.workers=[127.0.0.1:1]"])


def test_the_colocated_recipes_are_the_ones_that_colocate():
    colocated = {n for n in recipes() if (c := load_config(n).cluster) and c.colocate}
    assert colocated == COLOCATED


def test_a_negative_staleness_is_a_type_error(capsys):
    assert main(["--dry-run", "async.max_staleness=-1"]) == 2
    assert "async.max_staleness: Input should be greater than or equal to 0" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("name", sorted(set(recipes()) - COLOCATED))
def test_abort_at_push_reaches_the_engines_and_is_refused_where_none_would_abort(name, capsys):
    config = load_config(name, [*PARTIAL, "async.at_push=abort"])
    assert config.engine_for("/m", replica=1).at_push == "abort"  # type: ignore[union-attr]
    assert load_config(name, PARTIAL).engine_for("/m", 1).at_push == "wait"  # type: ignore[union-attr]
    written = json.loads(config.model_dump_json())
    assert TrainerConfig.model_validate(written) == config
    refused = [
        ["async.at_push=abort"],  # synchronous: nothing runs at a push
        [*PARTIAL, "async.at_push=abort", "engine={kind: hf}"],
        [*PARTIAL, "async.at_push=abort", "engine.at_push=wait"],
    ]
    for overrides in refused:
        assert main([name, "--dry-run", *overrides]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert "async.at_push: abort needs async.max_staleness >= 1 and a vllm engine" in err
    one_step_off = load_config(name, ["async.max_staleness=1", "async.at_push=abort"])
    assert one_step_off.engine_for("/m", 0).at_push == "abort"  # type: ignore[union-attr]


@pytest.mark.parametrize("name", sorted(recipes()))
def test_asynchronous_steps_correct_stale_tokens_unless_the_recipe_says_otherwise(name):
    assert load_config(name).algo.off_policy.kind == "none"  # synchronous: nothing is stale
    for steps in (["async.max_staleness=1"], PARTIAL):
        config = load_config(name, steps)
        assert config.algo.off_policy.model_dump() == {"kind": "tis", "level": "token", "cap": 2.0}
        written = json.loads(config.model_dump_json())  # config.yaml keeps it for --resume
        assert TrainerConfig.model_validate(written) == config
        chosen = load_config(name, [*steps, "algo.off_policy.kind=mis"])
        assert chosen.algo.off_policy.kind == "mis"
        assert load_config(name, [*steps, "algo.off_policy.kind=none"]).algo.off_policy.kind == (
            "none"
        )


def test_top_p_below_one_refuses_a_correction_in_one_line(capsys):
    refused = {
        ("rollout.top_p=0.9", "algo.off_policy.kind=tis"): "algo.off_policy.kind tis with rollout",
        ("rollout.top_p=0.9", "algo.off_policy.kind=mis"): "algo.off_policy.kind mis with rollout",
        ("rollout.top_p=0.9", "async.max_staleness=1"): "rollout.top_p < 1 rules out",
    }
    for overrides, message in refused.items():
        assert main(["--dry-run", *overrides]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err
    taken = ["rollout.top_p=0.9", "async.max_staleness=1", "algo.off_policy.kind=none"]
    assert main(["--dry-run", *taken]) == 0  # stale tokens trained uncorrected, as asked
