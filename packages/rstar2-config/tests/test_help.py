"""`--help-config`: every key with its type, default and description, from the schema."""

from __future__ import annotations

import argparse

import pytest

from rstar2_config import describe, help_config_action, help_text


def test_every_key_is_a_line_under_its_section(app):
    text = help_text(app.Config)
    assert "lr: float = 0.001  -- Learning rate." in text.splitlines()  # top level: no indent
    assert "  run.seed: int = 0  -- The run seed." in text
    assert "model (kind: tiny)  -- A tiny model built on the spot." in text
    assert "model (kind: pretrained)  -- A model folder." in text
    assert "  model.path: str = required  -- The folder." in text
    assert "  stages.N.steps: int = 1  -- RL steps." in text
    assert "  betas: tuple[float, float] = [0.9, 0.999]" not in text  # a top-level key
    assert "betas: tuple[float, float] = [0.9, 0.999]  -- AdamW betas." in text
    assert "cluster  -- A cluster; None: here. (a section, unset by default)" in text
    assert [d.key for d in describe(app.Config) if not d.description] == []


def test_one_section_and_no_such_section(app):
    text = help_text(app.Config, "run")
    assert text.splitlines()[0] == "run  -- The run itself."
    assert all(line.startswith(("run", "  run.")) for line in text.splitlines())
    with pytest.raises(ValueError) as exc:
        help_text(app.Config, "runs")
    assert str(exc.value) == "no config section 'runs': choose one of run, model, stages, cluster"


def test_the_option_prints_and_exits(app, capsys):
    parser = argparse.ArgumentParser(prog="app")
    parser.add_argument("--help-config", action=help_config_action(app.Config, "app"))
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--help-config", "model"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("model (kind: tiny)")
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--help-config", "nope"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (
        "app: no config section 'nope': choose one of run, model, stages, cluster\n"
    )
