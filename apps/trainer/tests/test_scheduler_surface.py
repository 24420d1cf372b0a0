"""The scheduling policies a recipe can name are the ones the project recommends: `rstar2-train
--help-config scheduler` and the config schema list least_requests and kv_aware and no research
policy (those are configured from `rstar2_rollout.research.config` only), and a recipe naming one
is refused in one line."""

from __future__ import annotations

import json

import pytest

from rstar2_rollout.research.config import ResearchPolicy
from rstar2_trainer.cli import main
from rstar2_trainer.config import TrainerConfig

RESEARCH = {"forecast", "kv_progress", "static", "power_of_two", "cache_aware", "least_tokens"}


def test_the_research_kinds_are_the_ones_apart():
    from typing import get_args

    kinds = {c.model_fields["kind"].default for c in get_args(get_args(ResearchPolicy)[0])}
    assert kinds == RESEARCH | {"least_requests", "kv_aware"}


def test_help_config_scheduler_lists_no_research_policy(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help-config", "scheduler"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    listed = {
        line.split("kind: ")[1].split(")")[0] for line in out.splitlines() if "kind: " in line
    }
    assert listed == {"least_requests", "kv_aware"}
    assert not any(kind in out for kind in RESEARCH)
    schema = json.dumps(TrainerConfig.model_json_schema())
    assert not any(f'"{kind}"' in schema for kind in RESEARCH)


def test_a_recipe_naming_a_research_policy_is_refused_in_one_line(capsys):
    assert main(["--dry-run", "scheduler.policy.kind=forecast"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "scheduler.policy" in err and "least_requests" in err
