"""A trajectory: the token stream of one rollout, its loss mask, and what happened in it.

`Trajectory` is what the trainer consumes. It satisfies rstar2-algos' scored-trajectory Protocol
structurally (group_id, reward, response_ids, loss_mask, tool_outcome_counts, answer_blocks,
turns) without importing it. Invariants, kept by `append` and checked by `validate`:
`len(response_ids) == len(loss_mask) == len(logprobs) == len(versions)`, mask values are 0/1,
logprobs are 0.0 and versions -1 wherever the mask is 0 (template and tool tokens were not
sampled).

Versions: `versions[i]` is the weights version token i was sampled with (the engine's
`Generation.weights_version`, its count of weight updates), -1 where not sampled or where the
engine could not tell. `oldest_version` is the smallest known one (None: none known). A
trajectory's staleness at a training step is the trainer's version minus its oldest;
`staleness_stats` summarises it over a batch (`staleness_mean`, `staleness_max`, and
`staleness_unknown`: trajectories without a known version, e.g. from an HTTP endpoint, and
`turns_resumed`: turns aborted at a weight push and resumed, `resumed_turns` summed). The
gRPC wire carries versions (`Trajectory.versions` in rollout.proto).

Tool outcomes, one per `<tool_call>` block the model wrote:
- ok: ran to completion (`ExecutionStatus.OK`, or `OUTPUT_TRUNCATED`: it ran, output was capped);
- error: the code raised or exited non-zero (`ERROR`), hit the memory limit (`MEMORY_EXCEEDED`),
  or the sandbox refused the request (`REJECTED`, e.g. code over the size limit);
- timeout: `TIMEOUT`;
- parse_error: never ran: malformed JSON, unknown tool, bad arguments, an unclosed tag, or a
  call beyond the per-turn limit.

Not covered: producing trajectories (`loop.py`) or grading them (rstar2-verify).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rstar2_sandbox import ExecutionStatus

FinishReason = Literal["answered", "no_tool_call", "max_turns", "max_length", "error"]
ToolOutcome = Literal["ok", "error", "timeout", "parse_error"]
TOOL_OUTCOMES: tuple[ToolOutcome, ...] = ("ok", "error", "timeout", "parse_error")

_OUTCOME_OF_STATUS: dict[ExecutionStatus, ToolOutcome] = {
    ExecutionStatus.OK: "ok",
    ExecutionStatus.OUTPUT_TRUNCATED: "ok",
    ExecutionStatus.ERROR: "error",
    ExecutionStatus.MEMORY_EXCEEDED: "error",
    ExecutionStatus.REJECTED: "error",
    ExecutionStatus.TIMEOUT: "timeout",
    # The sandbox failed (worker lost, servers full or unreachable): the loop ends such a
    # trajectory as an error, so this outcome never reaches the model's tool-error counts.
    ExecutionStatus.SANDBOX_ERROR: "error",
}


def outcome_of(status: ExecutionStatus) -> ToolOutcome:
    """The trainer-facing outcome of a sandbox status."""
    return _OUTCOME_OF_STATUS[status]


@dataclass
class ToolCallRecord:
    """One `<tool_call>` block and what became of it."""

    turn: int
    name: str
    code: str
    stdin: str
    outcome: ToolOutcome
    status: ExecutionStatus | None = None  # None: never executed (parse_error)
    message: str = ""  # why it failed to parse, or the sandbox's message
    response: str = ""  # the text returned to the model inside <tool_response>
    wall_s: float = 0.0  # time waiting on the sandbox


@dataclass
class Timings:
    """Wall time a trajectory spent waiting on the engine and on the sandbox."""

    generate_s: float = 0.0
    tool_s: float = 0.0


@dataclass
class Trajectory:
    """One rollout of one problem."""

    group_id: str  # the problem id: trajectories of one problem form a group
    sample_index: int = 0
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)  # 1: sampled by the policy
    logprobs: list[float] = field(default_factory=list)  # sampler's, per response token
    versions: list[int] = field(default_factory=list)  # weights version per token, -1: none
    turns: int = 0  # assistant turns generated
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    tool_outcome_counts: Mapping[str, int] = field(
        default_factory=lambda: dict.fromkeys(TOOL_OUTCOMES, 0)
    )
    answer_blocks: int = 0  # closed <answer> blocks over all turns
    final_answer: str | None = None  # content of the last <answer> block
    finish_reason: FinishReason | None = None
    error: str = ""  # set when finish_reason is "error"
    reward: float = 0.0  # set by the trainer from the grader
    timings: Timings = field(default_factory=Timings)

    @property
    def sampled_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def oldest_version(self) -> int | None:
        """The oldest weights version any of its tokens was sampled with; None if none known."""
        return min((v for v in self.versions if v >= 0), default=None)

    @property
    def resumed_turns(self) -> int:
        """Turns resumed on new weights after an abort at a push: two adjacent sampled tokens
        of different known versions (turns are separated by unsampled template tokens)."""
        v, m = self.versions, self.loss_mask
        pairs = zip(v[:-1], v[1:], m[:-1], m[1:], strict=True)
        return sum(1 for a, b, x, y in pairs if x and y and a >= 0 and b >= 0 and a != b)

    def append(
        self,
        token_ids: Sequence[int],
        *,
        sampled: bool,
        logprobs: Sequence[float] = (),
        version: int | None = None,
    ) -> None:
        """Add tokens to the response; logprobs and the weights version are kept only for
        sampled tokens."""
        ids = list(token_ids)
        if sampled and logprobs and len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} logprobs")
        self.response_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        kept = list(logprobs) if sampled and logprobs else [0.0] * len(ids)
        self.logprobs.extend(kept)
        tag = version if sampled and version is not None else -1
        self.versions.extend([tag] * len(ids))

    def record(self, call: ToolCallRecord) -> None:
        """Add a tool call and count its outcome."""
        self.tool_calls.append(call)
        counts = dict(self.tool_outcome_counts)
        counts[call.outcome] = counts.get(call.outcome, 0) + 1
        self.tool_outcome_counts = counts

    def validate(self) -> None:
        """Raise ValueError when the token bookkeeping is inconsistent."""
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"lengths differ: {n} ids, {len(self.loss_mask)} mask, {len(self.logprobs)} "
                f"logprobs, {len(self.versions)} versions"
            )
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss mask values must be 0 or 1")
        if any(m == 0 and lp != 0.0 for m, lp in zip(self.loss_mask, self.logprobs, strict=True)):
            raise ValueError("logprobs must be 0.0 where the mask is 0")
        if any(m == 0 and v != -1 for m, v in zip(self.loss_mask, self.versions, strict=True)):
            raise ValueError("versions must be -1 where the mask is 0")
        counted = {k: 0 for k in TOOL_OUTCOMES}
        for call in self.tool_calls:
            counted[call.outcome] += 1
        if counted != dict(self.tool_outcome_counts):
            raise ValueError(f"tool_outcome_counts {self.tool_outcome_counts} != {counted}")


def staleness_stats(
    trajectories: Sequence[Trajectory], version: int, policies: Sequence[int] | None = None
) -> dict[str, float]:
    """Staleness at trainer weights `version` (its version minus each trajectory's oldest):
    mean and max over the trajectories with a known version (0.0 when none), and how many had
    none (`staleness_unknown`); `turns_resumed`, the turns resumed after an abort at a push.

    `policies` maps an engine's weights version (its count of loads) to the policy version it
    loaded, for a caller that pushes the same weights more than once (a colocated checkpoint
    puts the engines to sleep and pushes them back): staleness then counts policy updates, and
    `version` is the policy's. An engine version beyond the table counts as the newest."""

    def policy(v: int) -> int:
        if policies is None:
            return v
        return policies[v] if 0 <= v < len(policies) else policies[-1]

    ages = [version - policy(v) for v in (t.oldest_version for t in trajectories) if v is not None]
    return {
        "staleness_mean": sum(ages) / len(ages) if ages else 0.0,
        "staleness_max": float(max(ages, default=0)),
        "staleness_unknown": float(len(trajectories) - len(ages)),
        "turns_resumed": float(sum(t.resumed_turns for t in trajectories)),
    }
