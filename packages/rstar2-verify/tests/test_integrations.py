"""The reward function in verl's and TRL's shapes: called the way those trainers call it.

The torch-free tests run in an environment with rstar2-verify alone; the verl test reads the
installed verl's own loader and reward managers, and the GRPOTrainer test needs trl and the rollout
package's tiny model (all in the root dev group); each is skipped without what it needs.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import inspect
import logging
import time
import warnings
from pathlib import Path

import pytest

from rstar2_verify.integrations import (
    answer_reward,
    compute_score,
    solution_reward,
    trl_reward,
)


def test_verl_calls_compute_score_with_keywords():
    # verl's reward managers (NaiveRewardManager, the reward loop) call the custom reward
    # function as `compute_score(data_source=..., solution_str=..., ground_truth=...,
    # extra_info=..., **reward_kwargs)` and read a float (or a dict's "score").
    params = list(inspect.signature(compute_score).parameters)
    assert params[:4] == ["data_source", "solution_str", "ground_truth", "extra_info"]
    right = compute_score(
        data_source="openai/gsm8k",
        solution_str="Let me think. 3 + 4 = 7.\n#### 7",
        ground_truth="7",
        extra_info={"split": "train", "index": 0},
    )
    wrong = compute_score(
        data_source="lighteval/MATH",
        solution_str="so the answer is \\boxed{\\frac{1}{3}}",
        ground_truth="0.3",
        extra_info=None,
        some_reward_kwarg=1,
    )
    assert (right, wrong) == (1.0, 0.0)
    assert isinstance(right, float)
    assert compute_score("math", "\\boxed{2\\sqrt{2}}", "\\sqrt{8}") == 1.0  # positionally too
    assert compute_score("math", "\\boxed{5}", ["4", "5"]) == 1.0  # a list of accepted answers


def _verl_file(relative: str) -> Path:
    try:
        dist = importlib.metadata.distribution("verl")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("the root dev group installs verl (without its trainer's dependencies)")
    return Path(str(dist.locate_file(relative)))


def test_verls_own_loader_and_reward_managers_call_our_function():
    # Read from the installed verl, not restated: its loader (`load_extern_object`, what
    # `reward.custom_reward_function.path/name` go through) imports integrations.py by file
    # path under a made-up module name, and every reward manager's `self.compute_score(...)`
    # call passes the keywords collected here.
    spec = importlib.util.spec_from_file_location(
        "verl_import_utils", _verl_file("verl/utils/import_utils.py")
    )
    assert spec is not None and spec.loader is not None
    loader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loader)  # standard library only
    import rstar2_verify.integrations as ours

    assert ours.__file__ is not None
    score = loader.load_extern_object(module_path=ours.__file__, object_name="compute_score")
    assert score is not compute_score  # a second copy of the module, as verl gets it

    calls: set[frozenset[str]] = set()  # the keywords of each call site
    managers = [_verl_file("verl/workers/reward_manager"), _verl_file("verl/experimental")]
    for path in (f for folder in managers for f in folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "self.compute_score":
                calls.add(frozenset(k.arg for k in node.keywords if k.arg is not None))
    # per response (naive, dapo, limited, ...); `batch` passes plural names to a batched
    # function, which ours is not (the README says to use the per-response managers)
    single = {c for c in calls if "solution_str" in c}
    assert single == {frozenset({"data_source", "solution_str", "ground_truth", "extra_info"})}
    assert any("solution_strs" in c for c in calls)  # (and `**kwargs` pass-throughs)
    extra_info = {"index": 3, "num_turns": None, "rollout_reward_scores": {}}  # as naive.py
    call = {
        "data_source": "lighteval/MATH",
        "solution_str": "So the answer is \\boxed{\\frac{1}{2}}.",
        "ground_truth": "0.5",
        "extra_info": extra_info,
    }
    assert score(**call) == 1.0
    assert score(**(call | {"ground_truth": "2"})) == 0.0
    # `reward.custom_reward_function.reward_kwargs` are merged into the call as keywords
    assert score(**call, reward_router_address=None) == 1.0


def test_compute_score_never_raises_and_logs_once(caplog):
    caplog.set_level(logging.WARNING, logger="rstar2_verify.integrations")
    junk = [None, 3, {"a": 1}, ["x"], b"\xff\xfe", object()]
    for bad in junk:
        assert compute_score("math", bad, "3") == 0.0
        assert compute_score("math", "\\boxed{3}", bad) in {0.0, 1.0}
    assert compute_score("math", "\\boxed{3}", []) == 0.0
    assert sum("solution_str of type" in r.message for r in caplog.records) == 1


def test_compute_score_is_bounded():
    hostile = "\\boxed{" + "+".join(f"\\sqrt{{{k}}}" for k in range(2, 2000)) + "}"
    start = time.perf_counter()
    assert compute_score("math", hostile, "5") == 0.0
    assert time.perf_counter() - start < 1.0


def test_trl_reward_plain_and_chat_completions():
    plain = ["The answer is $12$.", "\\boxed{13}", "no idea"]
    chat = [[{"role": "assistant", "content": c}] for c in plain]
    golds = ["12", "12", "12"]
    kwargs = {"prompts": ["q"] * 3, "completion_ids": [[1]] * 3, "trainer_state": None}
    assert answer_reward(plain, answer=golds, **kwargs) == [1.0, 0.0, 0.0]
    assert answer_reward(chat, answer=golds, **kwargs) == [1.0, 0.0, 0.0]
    parts = [[{"role": "assistant", "content": [{"type": "text", "text": "\\boxed{12}"}]}]]
    assert solution_reward(parts, solution=["12"]) == [1.0]
    tool_turns = [
        [
            {"role": "assistant", "content": "let me compute"},
            {"role": "tool", "content": "\\boxed{12}"},  # a tool's output earns nothing
            {"role": "assistant", "content": "so \\boxed{11}"},
        ]
    ]
    assert answer_reward(tool_turns, answer=["12"]) == [0.0]
    custom = trl_reward(answer_column="gold")
    assert custom.__name__ == "rstar2_verify_gold"
    assert custom(["\\boxed{x=3}"], gold=["3"], prompts=["q"]) == [1.0]


def test_trl_reward_bad_input_scores_zero(caplog):
    caplog.set_level(logging.WARNING, logger="rstar2_verify.integrations")
    reward = trl_reward(answer_column="final")
    assert reward(["\\boxed{1}", "\\boxed{2}"], answer=["1", "2"]) == [0.0, 0.0]
    assert reward(["\\boxed{1}"], answer=["1"]) == [0.0]
    assert sum("no dataset column 'final'" in r.message for r in caplog.records) == 1
    assert answer_reward(["\\boxed{1}", 7, None], answer=["1", "1", "1"]) == [1.0, 0.0, 0.0]
    assert answer_reward(["\\boxed{1}"], answer=["1", "2"]) == [0.0]
    assert answer_reward(None, answer=[]) == []
    assert answer_reward(["\\boxed{1}"], answer=[1]) == [1.0]  # a numeric column


@pytest.mark.slow
def test_trl_grpo_trainer_steps_with_our_reward(tmp_path):
    pytest.importorskip("trl")
    tiny = pytest.importorskip("rstar2_rollout.tiny")
    with warnings.catch_warnings():  # trl warns about the installed vLLM version on import
        warnings.simplefilter("ignore")
        from datasets import Dataset
        from trl.trainer.grpo_config import GRPOConfig
        from trl.trainer.grpo_trainer import GRPOTrainer

    model_dir = tiny.build_tiny_model(tmp_path / "model", seed=0)
    calls: list[tuple[int, list[float | None]]] = []

    def reward(completions, **kwargs) -> list[float | None]:  # records TRL's call, scores with ours
        scores: list[float | None] = [*answer_reward(completions, **kwargs)]
        assert set(kwargs) >= {"prompts", "answer", "completion_ids", "trainer_state"}
        calls.append((len(completions), scores))
        return scores

    reward.__name__ = answer_reward.__name__
    prompts = [[{"role": "user", "content": f"What is {k} + {k}?"}] for k in range(4)]
    data = Dataset.from_dict({"prompt": prompts, "answer": [str(2 * k) for k in range(4)]})
    config = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-5,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        bf16=False,
        save_strategy="no",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(
            model=str(model_dir), reward_funcs=reward, args=config, train_dataset=data
        )
        trainer.train()
    assert calls and all(n == 4 and len(s) == 4 for n, s in calls)
    logged = [k for entry in trainer.state.log_history for k in entry]
    assert "rewards/rstar2_verify_answer/mean" in logged, sorted(set(logged))
