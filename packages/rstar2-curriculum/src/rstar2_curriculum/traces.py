"""Worked tool-call traces for SFT: teach a tiny model the paper's format on synthetic problems.

`sft_traces(problems, seed)` turns problems from `generate_problems` (they carry a reference
`solution` program) into short conversations: the question, an assistant turn that reasons in one
sentence and calls the python tool, the tool's output, and a final turn with
`<answer>... \\boxed{N} </answer>`. A share of traces (`failure_rate`) first calls a broken
program (a misspelt variable, an unclosed parenthesis, a missing import), reads the real error,
says what went wrong and calls the fixed program. A share (`check_failure_rate`) runs the
working program, then a check in a second call that fails because nothing carries over between
calls (`print(count == 42)`: a NameError), says so and answers with the first output: a failed call
that does not stand between the policy and the right answer. Another share (`direct_share`) of the problems
whose answer is short (at most `direct_max_digits` digits: a count, a residue) answers straight
away without the tool, as a non-reasoning instruct model does with a question whose answer looks
small: the answer in such a trace is right, but a small model cannot compute it in its head, so a
policy that answers directly on new problems mostly guesses wrong. The paper's SFT teaches the
format and leaves the habit of computing with the tool to RL; this share is how the tiny recipe
leaves RL that job. (Long answers stay with the tool: a model that learns to recall long numbers
learns to copy them from the tool's output more slowly.)

Every tool message is what the program really prints: all programs run in a fresh interpreter
(`python -I -S -c`) while the traces are made, and a trace whose final output is not the problem's
answer raises, so a wrong trace can never be produced. Traces depend only on (seed, problem id).
The rollout package's sandbox may word tracebacks differently (file names, trimming); the traces
teach the shape of a recovery, not the exact text.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from rstar2_curriculum._run import run_many
from rstar2_curriculum.problem import Problem
from rstar2_curriculum.sft import Message, SFTExample, render_python_call

_PLANS = {
    "product": "The exact product of two large numbers is easy to get wrong by hand.",
    "modpow": "The power is far too large to expand, but Python's pow takes a modulus.",
    "divisors": "I will count the divisors by trial division up to the square root.",
    "primes": "A sieve of Eratosthenes finds all the primes below the bound.",
    "factorial_digits": "The factorial is huge, so I will compute it exactly and add its digits.",
    "binomial": "This is a binomial coefficient, which math.comb computes exactly.",
    "divisible": "I will count the qualifying numbers directly with a loop.",
    "fibonacci": "I will iterate the recurrence.",
}
_OPENERS = ("", "Let me compute this with Python. ", "I should not do this in my head. ")
_CLOSERS = (
    "The program printed {n}.",
    "Python gives {n}.",
    "The output is {n}, which answers the question.",
)
_ANSWERS = ("The answer is \\boxed{{{n}}}.", "\\boxed{{{n}}}", "So the result is \\boxed{{{n}}}.")
_DIRECT = (
    "This is quick to work out directly.",
    "I can answer this without running code.",
    "I know this one.",
)
_CHECKS = (
    "Let me double-check that value.",
    "I will confirm the result with a second call.",
)
_AFTER_CHECK = (
    "The check failed: variables do not carry over between calls. The first program printed {n}.",
    "Nothing is kept between calls, so the check could not see {var}; the program printed {n}.",
)
_FIXES = {
    "typo": "I misspelt the variable {var}. Let me fix the name and run it again.",
    "syntax": "I left a parenthesis unclosed. Let me fix the syntax.",
    "import": "I forgot to import math. Let me add the import.",
}


@dataclass(frozen=True)
class _Plan:
    problem: Problem
    failure: str | None  # "typo" | "syntax" | "import" | None
    broken: str | None
    direct: bool  # answer without calling the tool
    rng_seed: str
    check: str | None = None  # a check program that fails (nothing carries over between calls)


def _break(code: str, var: str, failure: str) -> str:
    lines = code.split("\n")
    if failure == "typo":
        cut = len(var) // 2
        lines[-1] = f"print({var[:cut] + var[cut + 1 :]})"
    elif failure == "syntax":
        lines[-1] = f"print({var}"
    else:
        lines = [line for line in lines if line != "import math"]
    return "\n".join(lines)


def _plan(
    problem: Problem,
    seed: int,
    failure_rate: float,
    direct_share: float,
    direct_max_digits: int,
    check_failure_rate: float = 0.0,
) -> _Plan:
    if "solution" not in problem.metadata or "var" not in problem.metadata:
        raise ValueError(f"problem {problem.id} has no reference solution (not synthetic?)")
    text_seed = f"rstar2-trace-text:{seed}:{problem.id}"
    # its own stream, so that direct_share=0 leaves every other choice as it was
    short = len(problem.answer.lstrip("-")) <= direct_max_digits
    if short and random.Random(f"rstar2-trace-direct:{seed}:{problem.id}").random() < direct_share:
        return _Plan(problem, None, None, True, text_seed)
    rng = random.Random(f"rstar2-trace:{seed}:{problem.id}")
    code: str = problem.metadata["solution"]
    failure = None
    if rng.random() < failure_rate:
        kinds = ["typo", "syntax"] + (["import"] if "import math" in code.split("\n") else [])
        failure = rng.choice(kinds)
    broken = _break(code, problem.metadata["var"], failure) if failure else None
    check = None
    # its own stream, so that check_failure_rate=0 leaves every other choice as it was
    if random.Random(f"rstar2-trace-check:{seed}:{problem.id}").random() < check_failure_rate:
        check = f"print({problem.metadata['var']} == {problem.answer})"
    return _Plan(problem, failure, broken, False, text_seed, check)


def sft_traces(
    problems: Sequence[Problem],
    seed: int,
    failure_rate: float = 0.3,
    workers: int = 2,
    direct_share: float = 0.0,
    direct_max_digits: int = 3,
    check_failure_rate: float = 0.0,
) -> list[SFTExample]:
    """One worked trace per problem, in order; see the module docstring."""
    rates = {
        "failure_rate": failure_rate,
        "direct_share": direct_share,
        "check_failure_rate": check_failure_rate,
    }
    for name, value in rates.items():
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], not {value}")
    plans = [
        _plan(p, seed, failure_rate, direct_share, direct_max_digits, check_failure_rate)
        for p in problems
    ]
    codes = [p.problem.metadata["solution"] for p in plans]
    broken = [p.broken for p in plans if p.broken is not None]
    checks = [p.check for p in plans if p.check is not None]
    outputs = run_many(codes + broken + checks, workers=workers)
    good = outputs[: len(codes)]
    bad = iter(outputs[len(codes) : len(codes) + len(broken)])
    checked = iter(outputs[len(codes) + len(broken) :])

    examples = []
    for plan, code, result in zip(plans, codes, good, strict=True):
        problem = plan.problem
        if result.exit_code != 0 or result.stdout.strip() != problem.answer:
            raise RuntimeError(
                f"reference solution of {problem.id} printed {result.text!r}, "
                f"expected {problem.answer!r}"
            )
        rng = random.Random(plan.rng_seed)
        if plan.direct:
            answer = rng.choice(_ANSWERS).format(n=problem.answer)
            reason = rng.choice(_DIRECT)
            messages = [
                Message(role="user", content=problem.question),
                Message(
                    role="assistant",
                    content=f"<reason>{reason}</reason>\n<answer>{answer}</answer>",
                ),
            ]
            examples.append(SFTExample(messages=messages, id=problem.id))
            continue
        reason = rng.choice(_OPENERS) + _PLANS.get(problem.metadata.get("family", ""), "")
        messages = [Message(role="user", content=problem.question)]
        first_code = plan.broken if plan.broken is not None else code
        messages.append(
            Message(
                role="assistant",
                content=f"<reason>{reason.strip()}</reason>\n{render_python_call(first_code)}",
            )
        )
        if plan.broken is not None:
            failed = next(bad)
            if failed.exit_code == 0:
                raise RuntimeError(f"broken program of {problem.id} did not fail")
            fix = _FIXES[plan.failure or ""].format(var=problem.metadata["var"])
            messages.append(Message(role="tool", content=failed.text))
            messages.append(
                Message(
                    role="assistant",
                    content=f"<reason>{fix}</reason>\n{render_python_call(code)}",
                )
            )
        n = problem.answer
        messages.append(Message(role="tool", content=result.text))
        close = rng.choice(_CLOSERS).format(n=n)
        if plan.check is not None:
            failed = next(checked)
            if failed.exit_code == 0:
                raise RuntimeError(f"check program of {problem.id} did not fail")
            check_rng = random.Random(f"rstar2-trace-check-text:{seed}:{problem.id}")
            messages.append(
                Message(
                    role="assistant",
                    content=f"<reason>{check_rng.choice(_CHECKS)}</reason>\n"
                    f"{render_python_call(plan.check)}",
                )
            )
            messages.append(Message(role="tool", content=failed.text))
            var = problem.metadata["var"]
            close = check_rng.choice(_AFTER_CHECK).format(n=n, var=var)
        answer = rng.choice(_ANSWERS).format(n=n)
        messages.append(
            Message(
                role="assistant", content=f"<reason>{close}</reason>\n<answer>{answer}</answer>"
            )
        )
        examples.append(SFTExample(messages=messages, id=problem.id))
    return examples
