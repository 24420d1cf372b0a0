"""The agent loop against the real LocalSandbox: tool round trips, bad output, budgets, concurrency."""

from __future__ import annotations

import time

import pytest

from rstar2_rollout import (
    ChatFormat,
    RolloutConfig,
    RolloutSampling,
    RolloutTask,
    collect,
    one_engine_service,
    render_call,
    run_agent,
)
from rstar2_rollout.chat import IM_END, REASON_OPEN, system_prompt
from rstar2_rollout.engine import Generation
from rstar2_rollout.trajectory import Trajectory

CALL = render_call("print(6 * 7)")
ANSWER = " So it is 42. </reason><answer> \\boxed{42} </answer>"


def roll(runner, sandbox, tokenizer, scripted, script, config=None) -> Trajectory:
    model = scripted(tokenizer, {"p": script})
    cfg = config or RolloutConfig(temperature=0)
    traj = runner.run(run_agent(model, sandbox, tokenizer, RolloutTask("p", "What is 6*7?"), cfg))
    traj.validate()
    return traj


def segments(traj: Trajectory, tokenizer) -> list[tuple[int, str]]:
    """The response as (mask, text) runs."""
    out: list[tuple[int, str]] = []
    start = 0
    for i in range(1, len(traj.loss_mask) + 1):
        if i == len(traj.loss_mask) or traj.loss_mask[i] != traj.loss_mask[start]:
            text = tokenizer.decode(traj.response_ids[start:i], skip_special_tokens=False)
            out.append((traj.loss_mask[start], text))
            start = i
    return out


def test_a_tool_call_runs_in_the_sandbox_and_comes_back_as_a_user_turn(
    runner, sandbox, tokenizer, scripted
):
    traj = roll(runner, sandbox, tokenizer, scripted, [f" Compute. </reason>{CALL}", ANSWER])
    assert (traj.finish_reason, traj.turns, traj.final_answer) == ("answered", 2, "\\boxed{42}")
    assert traj.tool_outcome_counts == {"ok": 1, "error": 0, "timeout": 0, "parse_error": 0}
    assert traj.tool_calls[0].response == "42\n"
    assert segments(traj, tokenizer) == [
        (1, f" Compute. </reason>{CALL}{IM_END}"),
        (
            0,
            f"\n<|im_start|>user\n<tool_response>\n42\n\n</tool_response>{IM_END}\n"
            f"<|im_start|>assistant\n{REASON_OPEN}",
        ),
        (1, ANSWER + IM_END),
    ]
    sampled = [lp for lp, m in zip(traj.logprobs, traj.loss_mask, strict=True) if m]
    assert sampled == [-0.5] * traj.sampled_tokens


def test_without_the_tool_a_call_is_not_run_and_the_prompt_has_no_schema(
    runner, tokenizer, scripted
):
    config = RolloutConfig(temperature=0, tool=False)
    traj = roll(runner, None, tokenizer, scripted, [f" Compute. </reason>{CALL}", ANSWER], config)
    assert (traj.finish_reason, traj.turns, traj.tool_calls) == ("no_tool_call", 1, [])
    prompt = tokenizer.decode(traj.prompt_ids, skip_special_tokens=False)
    assert "<tools>" not in prompt and "<reason>" in prompt
    with_tool = tokenizer.decode(
        ChatFormat(tokenizer, system_prompt()).prompt_ids("What is 6*7?"), skip_special_tokens=False
    )
    assert "<tools>" in with_tool
    # a tool call with the tool offered and no sandbox: the system's failure, said in one line
    traj = roll(runner, None, tokenizer, scripted, [f" Compute. </reason>{CALL}"])
    assert (traj.finish_reason, traj.error) == ("error", "a tool call, and no sandbox to run it")


def test_tool_failures_are_structured_outcomes(runner, sandbox, tokenizer, scripted):
    script = [
        render_call("1/0"),
        render_call("import time\ntime.sleep(60)"),
        render_call("print(input())", "hello"),
        ANSWER,
    ]
    traj = roll(
        runner,
        sandbox,
        tokenizer,
        scripted,
        script,
        # 2 s, not less: on a loaded machine a quick call must not be mistaken for a timeout
        RolloutConfig(temperature=0, tool_timeout_s=2.0),
    )
    assert [c.outcome for c in traj.tool_calls] == ["error", "timeout", "ok"]
    assert "ZeroDivisionError" in traj.tool_calls[0].response
    assert traj.tool_calls[0].response.startswith("tool call failed\nreason:\n")
    assert traj.tool_calls[1].response.startswith("tool call failed\nreason:\ntimeout")
    assert traj.tool_calls[2].response == "hello\n"
    assert traj.timings.tool_s >= 2.0 and traj.finish_reason == "answered"


@pytest.mark.parametrize(
    ("script", "finish", "outcomes"),
    [
        (["@@ garbage ))) no tags at all"], "no_tool_call", []),
        ([" reasoning </reason><answer> 3 </answer><answer> 4 </answer>"], "answered", []),
        (["<tool_call>{not json</tool_call>", ANSWER], "answered", ["parse_error"]),
        (
            ['<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', ANSWER],
            "answered",
            ["parse_error"],
        ),
        (
            [
                '<tool_call>{"name": "execute_python_code_with_standard_io", "arguments": {"c": 1}}'
                "</tool_call>",
                ANSWER,
            ],
            "answered",
            ["parse_error"],
        ),
        (
            ['<tool_call>{"name": "execute_python_code_with_standard_io"', ANSWER],
            "answered",
            ["parse_error"],
        ),
        ([CALL * 50, ANSWER], "answered", ["ok"] + ["parse_error"] * 49),
        ([CALL] * 3, "max_turns", ["ok"] * 3),
        ([("never stops " * 200, False)], "max_length", []),
    ],
    ids=[
        "garbage",
        "two-answers",
        "bad-json",
        "unknown-tool",
        "bad-args",
        "unclosed",
        "50-calls",
        "max-turns",
        "runaway",
    ],
)
def test_bad_model_output_ends_cleanly(
    runner, sandbox, tokenizer, scripted, script, finish, outcomes
):
    cfg = RolloutConfig(temperature=0, max_turns=3, max_response_tokens=8000)
    traj = roll(runner, sandbox, tokenizer, scripted, script, cfg)
    assert traj.finish_reason == finish
    assert [c.outcome for c in traj.tool_calls] == outcomes
    assert len(traj.response_ids) <= 8000
    assert sum(traj.tool_outcome_counts.values()) == len(outcomes)


def test_fifty_calls_run_one_and_explain_the_rest(runner, sandbox, tokenizer, scripted):
    traj = roll(runner, sandbox, tokenizer, scripted, [CALL * 50, ANSWER])
    responses = [c.response for c in traj.tool_calls]
    assert responses[0] == "42\n"
    assert set(responses[1:]) == {"Not executed: at most 1 tool call(s) per turn."}
    text = tokenizer.decode(traj.response_ids, skip_special_tokens=False)
    assert text.count("<tool_response>") == 50


def test_the_budget_counts_tool_tokens_and_is_never_exceeded(runner, sandbox, tokenizer, scripted):
    big = render_call("print('x' * 3000)")
    cfg = RolloutConfig(temperature=0, max_response_tokens=300)
    traj = roll(runner, sandbox, tokenizer, scripted, [big, ANSWER], cfg)
    assert traj.finish_reason == "max_length" and len(traj.response_ids) == 300
    assert traj.loss_mask[-1] == 0  # the tool response was cut

    uncounted = RolloutConfig(temperature=0, max_response_tokens=300, count_tool_tokens=False)
    traj = roll(runner, sandbox, tokenizer, scripted, [big, ANSWER], uncounted)
    assert traj.finish_reason == "answered" and len(traj.response_ids) > 300
    assert traj.sampled_tokens <= 300


def test_long_tool_output_is_truncated_in_the_middle(runner, sandbox, tokenizer, scripted):
    code = "print('HEAD' + 'x' * 5000 + 'TAIL')"
    cfg = RolloutConfig(temperature=0, max_tool_response_chars=200)
    traj = roll(runner, sandbox, tokenizer, scripted, [render_call(code), ANSWER], cfg)
    response = traj.tool_calls[0].response
    assert (
        len(response) == 200 and response.startswith("HEAD") and response.rstrip().endswith("TAIL")
    )
    assert "characters omitted" in response


def test_an_engine_failure_ends_the_trajectory_with_its_reason(
    runner, sandbox, tokenizer, scripted
):
    class FailingEngine(scripted):
        async def generate(self, prompt_ids, params, request_id):
            return Generation([], finish_reason="error", error="engine died: out of memory")

    engine = FailingEngine(tokenizer, {})
    cfg = RolloutConfig(temperature=0)
    traj = runner.run(run_agent(engine, sandbox, tokenizer, RolloutTask("p", "q"), cfg))
    assert (traj.finish_reason, traj.error, traj.response_ids) == (
        "error",
        "engine died: out of memory",
        [],
    )


def test_token_in_token_out_and_where_re_rendering_drifts(runner, sandbox, tokenizer, scripted):
    """The model may sample a split that the tokenizer would merge: re-rendering loses it."""
    fmt = ChatFormat(tokenizer)
    merged = tokenizer.encode(" prime", add_special_tokens=False)
    assert len(merged) == 1  # " prime" is one token of the tiny vocabulary
    split = [
        tokenizer.encode(" pr", add_special_tokens=False)[0],
        tokenizer.encode("ime", add_special_tokens=False)[0],
    ]
    assert tokenizer.decode(split) == " prime"

    class SplitSampler(scripted):
        async def generate(self, prompt_ids, params, request_id):
            ids = [*split, *fmt.ids(" </reason><answer> \\boxed{123} </answer>"), fmt.im_end_id]
            return Generation(ids, [-1.0] * len(ids))

    engine = SplitSampler(tokenizer, {})
    traj = runner.run(run_agent(engine, sandbox, fmt, RolloutTask("p", "q"), RolloutConfig()))
    assert traj.response_ids[:2] == split  # what was sampled is what is kept
    text = tokenizer.decode(traj.prompt_ids + traj.response_ids, skip_special_tokens=False)
    rerendered = tokenizer.encode(text, add_special_tokens=False)
    first = next(
        i
        for i, (a, b) in enumerate(
            zip(rerendered, traj.prompt_ids + traj.response_ids, strict=False)
        )
        if a != b
    )
    assert first == len(traj.prompt_ids)  # the drift starts at the first sampled token
    assert (
        rerendered[first] == merged[0]
        and len(rerendered) == len(traj.prompt_ids) + len(traj.response_ids) - 1
    )


def test_a_slow_tool_never_stalls_other_trajectories(runner, sandbox, tokenizer, scripted):
    slow = render_call("import time\ntime.sleep(3)\nprint('slow done')")
    fast = [render_call(f"print({i})") for i in range(4)] + [ANSWER]
    scripts = {"slow": [slow, ANSWER], **{f"fast{i}": fast for i in range(4)}}
    model = scripted(tokenizer, scripts, delay_s=0.02)
    cfg = RolloutConfig(temperature=0, max_turns=6, tool_timeout_s=10)
    finished: dict[str, float] = {}

    async def main() -> None:
        service = one_engine_service(model, sandbox, tokenizer, cfg)
        problems = [RolloutTask(name, "q") for name in scripts]
        started = time.perf_counter()
        try:
            async for result in service.generate(problems, RolloutSampling.of(cfg, 1)):
                traj = result.trajectory
                finished[traj.group_id] = time.perf_counter() - started
                assert traj.finish_reason == "answered", traj
        finally:
            await service.scheduler.close()

    runner.run(main())
    assert finished["slow"] >= 3.0
    assert max(v for k, v in finished.items() if k != "slow") < 2.5  # 5 turns each, meanwhile


class AnswerIs42:
    """A grader: reward 1 when the final answer block holds 42; the grade is the answer."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    async def score(self, problem: RolloutTask, trajectory: Trajectory) -> str | None:
        self.seen.append((problem.id, trajectory.sample_index))
        trajectory.reward = float("42" in (trajectory.final_answer or ""))
        return trajectory.final_answer


def test_collect_grades_every_trajectory_and_returns_them_by_problem(
    runner, sandbox, tokenizer, scripted
):
    scripts = {"a": [ANSWER], "b": [CALL, ANSWER], "c": [" I give up.</reason>"]}
    model = scripted(tokenizer, scripts)
    cfg = RolloutConfig(temperature=0)
    service = one_engine_service(model, sandbox, tokenizer, cfg)
    grader, graded = AnswerIs42(), []
    problems = [RolloutTask("a", "q"), RolloutTask("b", "q"), RolloutTask("c", "q")]
    collected = runner.run(
        collect(
            service,
            grader,
            problems,
            3,
            cfg,
            on_graded=lambda p, t, grade: graded.append((p.id, t.sample_index, grade)),
        )
    )
    runner.run(service.scheduler.close())
    assert [(t.group_id, t.sample_index) for t in collected.trajectories] == [
        (p.id, i) for p in problems for i in range(3)
    ]
    assert [t.reward for t in collected.trajectories] == [1.0] * 6 + [0.0] * 3
    assert sorted(grader.seen) == [(p.id, i) for p in problems for i in range(3)]
    assert len(graded) == 9 and {g for _, _, g in graded if g} == {"\\boxed{42}"}
    assert collected.failed_jobs == [] and collected.rollout_s > 0
    seeds = {params.seed for _, _, params in model.requests}
    assert len(seeds) == len(model.requests)  # one seed per (problem, sample, turn)
