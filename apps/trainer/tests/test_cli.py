import os

import pytest

from rstar2_trainer.cli import main
from rstar2_trainer.config import ConfigError, load_config, recipes


def test_dry_run_prints_the_resolved_default_recipe(capsys):
    assert main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "name: grpo_roc" in out and "plan: tiny" in out


def test_the_restart_and_preemption_keys_are_accepted(capsys):
    """The contract: `rstar2-train --dry-run run.max_restarts=3 run.preempt_grace_s=120`."""
    assert main(["--dry-run", "run.max_restarts=3", "run.preempt_grace_s=120"]) == 0
    out = capsys.readouterr().out
    assert "max_restarts: 3" in out and "preempt_grace_s: 120.0" in out
    defaults = load_config("tiny").run
    assert defaults.max_restarts > 0 and defaults.preempt_grace_s > 0
    assert main(["--dry-run", "run.max_restarts=-1"]) == 2


def test_every_recipe_validates():
    assert "tiny" in recipes()
    for name in recipes():
        load_config(name)


def test_threads_default_to_every_core_this_process_may_use():
    assert load_config("tiny").run.threads == "auto"
    assert load_config("tiny").run.torch_threads == len(os.sched_getaffinity(0))
    assert load_config("tiny", ["run.threads=1"]).run.torch_threads == 1


def test_override_is_applied():
    config = load_config("tiny", ["rollout.top_p=0.9", "run.seed=3"])
    assert config.rollout.top_p == 0.9
    assert config.run.seed == 3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nope"], "no recipe 'nope'"),
        (["tiny", "rollout.no_such=1"], "rollout.no_such: unknown key"),
        (["tiny", "rollout.top_pp=1"], "rollout.top_pp: unknown key (did you mean top_p?)"),
        (["tiny", "rollout.top_p=-1"], "rollout.top_p"),
        (["tiny", "rollout.max_turns=7"], "rollout.max_turns is not read by the trainer"),
        (["tiny", "rollout.n=8"], "rollout.n is not read by the trainer"),
        (["tiny", "algo.kl_coef=0.1"], "set algo.kl_coef: 0"),
        (["tiny", "verify_service.mode=address"], "set address: host:port"),
        (["tiny", "tool.kind=remote"], "tool.addresses: Field required for tool.kind remote"),
        (["tiny", "verify_service.address=h:1"], "only read in mode address"),
        (["tiny", "garbage"], "not of the form a.b=value"),
        (["tiny", "eval.samples=4", "eval.temperature=0"], "set eval.temperature above 0"),
        (["tiny", "sft.direct_share=1.5"], "sft.direct_share"),
        (["tiny", "engine.replicas=2"], "engine.replicas is now engine_replicas"),
        (["tiny", "engine.max_num_seq=8"], "engine.max_num_seq: unknown key for engine.kind vllm"),
        (
            ["tiny", "engine.kind=hf", "engine.max_num_seqs=8"],
            "engine.max_num_seqs: unknown key for engine.kind hf (max_num_seqs is a key of "
            "engine.kind vllm)",
        ),
        (
            ["tiny", "model.kind=pretrained", "model.layers=2", "model.path=/m"],
            "model.layers: unknown key for model.kind pretrained (layers is a key of model.kind "
            "tiny)",  # the recipe's tiny keys go, the command line's stay
        ),
        (
            ["tiny", "curriculum.tiny.steps.3=5"],
            "curriculum.tiny.steps: Tuple should have at most 3",
        ),
        (
            ["tiny", "curriculum.tiny.steps.4=5"],
            "override curriculum.tiny.steps.4: index 4 is out of range: curriculum.tiny.steps "
            "has 3 items (0-2 replace one, 3 appends)",
        ),
        (["tiny", "eval.sources.1=a.jsonl"], "eval.sources is empty; 0 appends an item"),
        (["tiny", "run.seed.0=1"], "run.seed is a value, not a section"),
        (["tiny", "run.threads=0"], "run.threads: set a number of threads (at least 1) or auto"),
        (["tiny", "run.threads=many"], "or auto, not 'many'"),
        (["tiny", "engine.kind=sglang"], "engine: Input tag 'sglang' found using 'kind'"),
        (["tiny", "engine.model=/models/x"], "engine.model: the engines run the policy"),
        (["tiny", "engine.max_model_len=512"], "engine.max_model_len 512 is below the 1408"),
        (
            ["tiny", "engine={kind: openai, base_url: 'http://h/v1', model: m}"],
            "engine.kind openai cannot load the trainer's weights; use engine.kind: vllm or hf",
        ),
        (
            ["tiny", "cluster={engine_threads: 1}", "engine.tensor_parallel_size=2"],
            "engine.tensor_parallel_size differs from the 1 GPU(s) of cluster.gpus_per_engine",
        ),
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
    assert main(["tiny", "engine_replicas=2", f"run.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "one engine per process" in err
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_the_engine_section_is_rstar2_rollouts_engine_config_filled_with_the_run():
    from rstar2_rollout import HFEngineConfig, VLLMEngineConfig

    config = load_config("tiny", ["train.dtype=bfloat16", "engine.max_num_seqs=8"])
    engine = config.engine_for("/run/model", replica=1)
    assert isinstance(engine, VLLMEngineConfig)
    assert (engine.model, engine.dtype, engine.seed) == ("/run/model", "bfloat16", 1)
    assert engine.max_model_len == 1408  # tiny's longest budget (384) + 1024 of prompt
    assert engine.max_num_seqs == 8  # the recipe's setting wins
    hf = load_config("tiny", ["engine={kind: hf}"]).engine_for("/m", replica=0)
    assert hf == HFEngineConfig(model="/m", dtype="float32")


def test_a_written_config_reloads_to_the_same_engines():
    # `--resume` validates the run directory's config.yaml: the engines must come out the same.
    import json

    from rstar2_trainer.config import TrainerConfig

    for overrides in ([], ["engine={kind: hf}"], ["engine.max_num_seqs=8", "run.seed=5"]):
        config = load_config("tiny", overrides)
        written = json.loads(config.model_dump_json())
        assert written["engine"]["kind"] in ("vllm", "hf") and "model" not in written["engine"]
        again = TrainerConfig.model_validate(written)
        for replica in (0, 1):
            assert again.engine_for("/m", replica) == config.engine_for("/m", replica)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("sft.source=/nonexistent/sft.jsonl", "/nonexistent/sft.jsonl"),
        ("eval.sources=[/nonexistent/aime.jsonl]", "eval.sources: /nonexistent/aime.jsonl"),
        (
            "curriculum.source={kind: jsonl, path: /nonexistent/rl.jsonl}",
            "/nonexistent/rl.jsonl",
        ),
    ],
)
def test_data_mistakes_are_one_line_before_the_run_directory(tmp_path, capsys, override, message):
    run_dir = tmp_path / "run"
    assert main(["tiny", f"run.output_dir={run_dir}", override]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not run_dir.exists()


def test_a_number_in_an_override_indexes_a_list():
    config = load_config(
        "tiny",
        [
            "curriculum.tiny.steps.1=5",  # a list the recipe sets
            "optim.betas.0=0.8",  # a list only the schema's default holds
            "eval.sources.0=/data/aime.jsonl",  # index == length appends
            "sft.source.0.path=/data/sft.jsonl",  # ... a section, when keys follow
            "sft.source.0.weight=0.5",
        ],
    )
    assert config.curriculum.tiny.steps == (20, 5, 20)
    assert config.optim.betas == (0.8, 0.999)
    assert config.eval.sources == ["/data/aime.jsonl"]
    assert [(s.path, s.weight) for s in config.sft.source] == [("/data/sft.jsonl", 0.5)]


def test_switching_a_sections_kind_drops_the_recipes_keys_of_the_old_kind(tmp_path, capsys):
    # The contract: tiny.yaml's model is {kind: tiny, vocab_size, ...} and its curriculum.source
    # {kind: synthetic, n, difficulty}; a user types only the new kind's keys.
    argv = ["--dry-run", "model.kind=pretrained", f"model.path={tmp_path}"]
    assert main(argv) == 0
    assert f"model:\n  kind: pretrained\n  path: {tmp_path}\n" in capsys.readouterr().out
    argv = ["--dry-run", "curriculum.source.kind=jsonl", f"curriculum.source.path={tmp_path}/f"]
    assert main(argv) == 0
    config = load_config("tiny", argv[1:])
    assert config.curriculum.source.kind == "jsonl"
    assert load_config("tiny", ["engine.kind=hf"]).engine.kind == "hf"


def test_every_mistake_is_listed_a_line_each(capsys):
    argv = ["tiny", "rollout.top_p=-1", "optim.lr=0", "rollout.no_such=1", "sft.epochs=x"]
    argv += ["run.seed.0=1"]
    assert main(argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "rstar2-train: 5 mistakes in tiny.yaml:"
    assert sorted(lines[1:]) == [
        "rstar2-train: optim.lr: Input should be greater than 0 (got 0)",
        "rstar2-train: override run.seed.0: run.seed is a value, not a section",
        "rstar2-train: rollout.no_such: unknown key",
        "rstar2-train: rollout.top_p: Input should be greater than 0 (got -1)",
        "rstar2-train: sft.epochs: Input should be a valid integer, unable to parse string as an "
        "integer (got 'x')",
    ]


def test_help_config_lists_keys_types_defaults_and_descriptions(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help-config"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "  run.seed: int = 0  -- The run seed; every other seed derives from it." in out
    assert "  run.output_dir: Path | None = null  -- Run directory;" in out
    assert "engine (kind: vllm)  -- " in out and "engine (kind: hf)  -- " in out  # each variant
    assert "algo (name: grpo_roc)  -- " in out
    assert "  curriculum.stages.N.name: str = required" in out
    with pytest.raises(SystemExit) as exit_:
        main(["--help-config", "optim"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("optim  -- ") and "optim.lr: float = 1e-06" in out
    assert all(line.startswith(("optim", "  optim.")) for line in out.splitlines())


def test_help_config_of_an_unknown_section_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--help-config", "optimizer"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no config section 'optimizer': choose one of run, model" in err


def test_help_config_runs_as_a_command():  # the contract: `rstar2-train --help-config` exits 0
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "rstar2_trainer.cli", "--help-config", "run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "run.keep_checkpoints: int = 2" in proc.stdout


def test_every_config_key_has_a_description():
    from rstar2_config import describe
    from rstar2_trainer.config import TrainerConfig

    docs = describe(TrainerConfig)
    assert len(docs) > 100  # the walk reaches the packages' sections and every variant
    assert [d.key for d in docs if not d.description] == []
