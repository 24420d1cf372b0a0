import pytest

from rstar2_trainer.cli import main
from rstar2_trainer.config import ConfigError, load_config, recipes


def test_dry_run_prints_the_resolved_default_recipe(capsys):
    assert main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "name: grpo_roc" in out and "plan: tiny" in out


def test_every_recipe_validates():
    assert "tiny" in recipes()
    for name in recipes():
        load_config(name)


def test_override_is_applied():
    config = load_config("tiny", ["rollout.top_p=0.9", "run.seed=3"])
    assert config.rollout.top_p == 0.9
    assert config.run.seed == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nope"], "no recipe 'nope'"),
        (["tiny", "rollout.no_such=1"], "unknown key 'rollout.no_such'"),
        (["tiny", "rollout.top_p=-1"], "rollout.top_p"),
        (["tiny", "rollout.max_turns=7"], "rollout.max_turns is not read by the trainer"),
        (["tiny", "rollout.n=8"], "rollout.n is not read by the trainer"),
        (["tiny", "algo.kl_coef=0.1"], "set algo.kl_coef: 0"),
        (["tiny", "verify_service.mode=address"], "set address: host:port"),
        (["tiny", "tool.kind=remote"], "tool.remote.addresses"),
        (["tiny", "verify_service.address=h:1"], "only read in mode address"),
        (["tiny", "garbage"], "not of the form a.b=value"),
        (["tiny", "eval.samples=4", "eval.temperature=0"], "set eval.temperature above 0"),
        (["tiny", "sft.direct_share=1.5"], "sft.direct_share"),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1
    with pytest.raises(ConfigError):
        load_config(argv[0], argv[1:])


def test_two_local_cpu_vllm_engines_are_refused(tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("the refusal is for the CPU build of vLLM")
    assert main(["tiny", "engine.replicas=2", f"run.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "one engine per process" in err
    assert not (tmp_path / "run" / "config.yaml").exists()
