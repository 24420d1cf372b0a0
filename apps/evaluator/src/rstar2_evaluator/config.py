"""`EvalConfig`: what to evaluate, on which benchmark, with which protocol, tool and grader.

The defaults are the paper's protocol (section 5.1): temperature 0.6, 16 samples per problem, up
to 30 assistant turns, 30,720 response tokens (the repository's `max_response_length`). The
configs in `configs/` are YAML files of this model; `load_config` reads one, applies `a.b=value`
overrides from the command line (a number indexes a list: `pass_k.0=2`) and validates, naming
every mistake on a line of its own (rstar2-config). Nothing here reads the environment.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    SerializationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from rstar2_config import ConfigError as ConfigError  # raised by load_config
from rstar2_config import Recipes, Section, load
from rstar2_curriculum import BenchmarkConfig
from rstar2_rollout import EngineConfig, OpenAIEngineConfig, RewardConfig, SamplingProtocol
from rstar2_sandbox import LocalSandboxConfig, SandboxBackendConfig, SandboxConfig
from rstar2_verify import VerifyConfig

# The evaluator's default rule: grade the whole response, truncated or not (any model's answer).
FREE_FORM = RewardConfig(graded="response", truncated="graded")

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
if not CONFIG_DIR.is_dir():  # editable install: the configs live beside src/
    CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
CONFIGS = Recipes(CONFIG_DIR, noun="config")

_Frozen = Section  # the sections below: frozen, unknown keys refused


class LocalModel(_Frozen):
    """A Hugging Face-format model folder, run in this process."""

    kind: Literal["local"] = "local"
    path: str = Field(description="The folder with config.json, weights and tokenizer.")
    engine: EngineConfig | None = Field(
        default=None,
        description="rstar2-rollout's EngineConfig (kind: vllm | hf; `model.engine=hf` for short); "
        "None, written auto: vllm when installed, else hf. Its model, context, seed and KV size are "
        "the evaluation's unless set here.",
    )
    max_model_len: int | None = Field(
        default=None,
        gt=0,
        description="Prompt plus response limit; None: engine.max_model_len where set, else the "
        "response budget + 4096, capped by the model's own.",
    )
    kv_cache_gib: float = Field(
        default=4.0, gt=0, description="vLLM's KV-cache size in GiB (engine.kv_cache_memory_bytes)."
    )
    base: str | None = Field(
        default=None,
        description="For a LoRA adapter folder (adapter_config.json): its base model's folder; "
        "None: the adapter_config.json's base_model_name_or_path.",
    )

    @field_validator("engine", mode="before")
    @classmethod
    def _engine_by_name(cls, value: Any) -> Any:
        # `model.engine=vllm` names a kind with its defaults; `transformers` is hf's old name.
        if isinstance(value, str):
            return None if value == "auto" else {"kind": "hf" if value == "transformers" else value}
        if isinstance(value, dict) and "kind" not in value:
            raise ValueError(
                "model.engine with settings needs its kind (vllm or hf), e.g. "
                "model.engine.kind=vllm"
            )
        return value

    @field_serializer("engine")
    def _engine_as_written(self, engine: Any, info: SerializationInfo) -> Any:
        # What was set, not the defaults, so a run's identity does not move with rstar2-rollout's
        # defaults; a kind alone is written by name (auto, vllm, hf), so older run folders resume.
        if engine is None:
            return "auto"
        written = engine.model_dump(mode=info.mode, exclude_unset=True)
        return {"kind": engine.kind, **written} if set(written) - {"kind"} else engine.kind

    @model_validator(mode="after")
    def _one_setting_each(self) -> LocalModel:
        engine = self.engine
        if engine is None:
            return self
        if isinstance(engine, OpenAIEngineConfig):  # a served model, not a folder run here
            raise ValueError(
                "model.engine.kind openai is a served model: give its URL as MODEL "
                "(rstar2-eval run http://HOST:PORT/v1 BENCH model.tokenizer=FOLDER)"
            )
        explicit = engine.model_fields_set
        if "model" in explicit:
            raise ValueError("model.engine.model: the engine runs model.path; remove it")
        if "max_model_len" in explicit and "max_model_len" in self.model_fields_set:
            raise ValueError("set model.max_model_len or model.engine.max_model_len, not both")
        if "kv_cache_memory_bytes" in explicit and "kv_cache_gib" in self.model_fields_set:
            raise ValueError(
                "set model.kv_cache_gib or model.engine.kv_cache_memory_bytes, not both"
            )
        return self


class EndpointModel(_Frozen):
    """An OpenAI-compatible completions endpoint (vLLM serve, SGLang, ...)."""

    kind: Literal["openai"] = "openai"
    url: str = Field(description="Base URL, e.g. http://host:8000/v1.")
    model: str = Field(default="", description="Served model name; empty: the first listed.")
    tokenizer: str = Field(
        description="Folder with the model's tokenizer: the agent loop works in token ids."
    )
    api_key: str = Field(
        default="", exclude=True, repr=False, description="Bearer token; never written to disk."
    )
    timeout_s: float = Field(default=600.0, gt=0, description="Per-request timeout.")


ModelConfig = Annotated[LocalModel | EndpointModel, Field(discriminator="kind")]


class JudgeConfig(_Frozen):
    """The judge of pairwise benchmarks (Arena-Hard): an OpenAI-compatible chat endpoint."""

    url: str = Field(
        default="", description="Base URL, e.g. https://api.openai.com/v1; empty: no judge."
    )
    model: str = Field(default="", description="The judge model's name at that endpoint.")
    api_key: str = Field(
        default="",
        exclude=True,
        repr=False,
        description="Bearer token; rstar2-eval reads it from the variable api_key_env, and it "
        "is never written to disk.",
    )
    api_key_env: str = Field(
        default="OPENAI_API_KEY", description="The environment variable holding the key."
    )
    timeout_s: float = Field(default=600.0, gt=0, description="Per-request timeout.")
    concurrency: int = Field(default=16, gt=0, description="Judge requests in flight at once.")
    max_tokens: int | None = Field(
        default=None,
        gt=0,
        description="The judge's reply budget; None: the benchmark's own (arena-hard-auto's "
        "4096 for v0.1, 16000 for v2).",
    )
    published: str | None = Field(
        default=None,
        description="Arena-Hard: the judge folder under the data's model_judgment/ whose "
        "published judgments (other models, same judge) join the style-controlled fit, as "
        "arena-hard-auto fits every model together; None: model_judgment/<judge.model>/ when "
        "the data has it; empty: none (the run's model is fitted alone: its win probability at "
        "its own average style, not comparable with a leaderboard).",
    )


class CodeSettings(_Frozen):
    """LiveCodeBench: which problems, and how each test runs in the sandbox."""

    release: str = Field(
        default="release_v6",
        description="The files of a --data folder: release_vN (test.jsonl .. testN.jsonl, as "
        "LiveCodeBench) or vN (testN.jsonl alone).",
    )
    start_date: str = Field(
        default="", description="Keep problems whose contest date is on or after this (YYYY-MM-DD)."
    )
    end_date: str = Field(
        default="", description="Keep problems whose contest date is before this (YYYY-MM-DD)."
    )
    timeout_s: float = Field(default=6.0, gt=0, description="Wall limit of one test's run.")
    tests_at_once: int = Field(
        default=8, gt=0, description="Tests of one sample run at once (it stops at a failure)."
    )


def _tool_spelling(data: Any) -> Any:
    """The evaluator's tool spellings: `tool=false` (or true) is `use_tool`; the old
    `{kind: grpc, address: "a,b"}` is rstar2-sandbox's `{kind: remote, addresses: [a, b]}`, and
    the limits of `{kind: local, sandbox: {...}}` are the top-level `sandbox` section."""
    if isinstance(data, dict) and isinstance(data.get("tool"), bool):
        data = {k: v for k, v in data.items() if k != "tool"} | {"use_tool": data["tool"]}
    if not isinstance(data, dict) or not isinstance(data.get("tool"), dict):
        return data
    tool = dict(data["tool"])
    if tool.get("kind") == "grpc":
        if tool.pop("token", None):
            raise ValueError(
                "tool.token is gone (a secret on a command line): write the token to a 0600 "
                "file and set tool.token_file"
            )
        address = str(tool.pop("address", ""))
        tool["kind"] = "remote"
        tool["addresses"] = [a.strip() for a in address.split(",") if a.strip()]
    if tool.get("kind", "local") == "local" and isinstance(tool.get("sandbox"), dict):
        limits = dict(tool.pop("sandbox"))
        if "workers" in limits:
            tool["workers"] = limits.pop("workers")
        data = {**data, "sandbox": {**limits, **dict(data.get("sandbox") or {})}}
    return {**data, "tool": tool}


class EvalConfig(SamplingProtocol):
    """One evaluation run: a sampling protocol (rstar2-rollout's, shared with rstar2-train: its
    samples, temperature, top_p, max_turns, max_response_tokens, seed and reward keys) plus the
    model, the problems, the tool and the grader."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: ModelConfig = Field(description="The policy: a local folder or an endpoint.")
    benchmark: BenchmarkConfig = Field(description="The problems.")
    system_prompt: Literal["paper", "compact"] = Field(
        default="paper",
        description="The system prompt the policy was trained with: the paper's, or the compact "
        "one of rstar2-train's tiny recipe (its RUN_DIR/policy/rstar2.json says which).",
    )
    pass_k: tuple[int, ...] = Field(
        default=(1, 2, 4, 8, 16), description="k of pass@k and maj@k (k > samples is dropped)."
    )
    concurrency: int = Field(default=64, gt=0, description="Samples in flight at once.")
    max_failures: int = Field(
        default=8,
        gt=0,
        description="Stop after this many samples failed for the engine or the tool (not the "
        "model); they are not recorded and a rerun retries them.",
    )
    max_tool_response_chars: int | None = Field(
        default=None, gt=0, description="Truncate tool output in the middle to this many chars."
    )
    tool_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Time limit of one tool call: the CPU time the call itself uses (a busy machine does "
            "not count against it), under a wall-clock ceiling of the sandbox's `wall_ceiling_factor` "
            "times it; None: the sandbox's default."
        ),
    )
    use_tool: bool = Field(
        default=True,
        description="Offer the Python tool (`tool=false` for short): false evaluates the same "
        "model without it (the prompt offers no tool and a tool call is text).",
    )
    tool: SandboxBackendConfig = Field(
        default_factory=LocalSandboxConfig,
        description="Where tool calls run (rstar2-sandbox's backends): local (in this process), "
        "child, remote (running servers, tool.addresses), fusion (a SandboxFusion endpoint).",
    )
    sandbox: SandboxConfig = Field(
        default_factory=SandboxConfig, description="Per-call limits of the tool."
    )
    verify: VerifyConfig = Field(default_factory=VerifyConfig, description="Answer grading.")
    judge: JudgeConfig = Field(
        default_factory=JudgeConfig, description="The judge of pairwise benchmarks (Arena-Hard)."
    )
    code: CodeSettings = Field(
        default_factory=CodeSettings, description="LiveCodeBench's problems and test runs."
    )
    reward: RewardConfig = Field(
        default=FREE_FORM,
        description="What is graded: the whole response by default (any model's free-form "
        "answer); reward.graded=answer_block reward.truncated=zero is rstar2-train's rule.",
    )
    out: str = Field(
        default="", description="Run directory; empty: runs/eval/<benchmark>-<model name>."
    )

    @model_validator(mode="before")
    @classmethod
    def _old_tool_spelling(cls, data: Any) -> Any:
        return _tool_spelling(data)

    def identity(self) -> dict[str, Any]:
        """What makes two runs the same evaluation (a resume must match it). The settings that
        only some benchmarks read join it where they differ from their defaults, so a run
        directory written before they existed still resumes."""
        keep = ("model", "benchmark", "samples", "temperature", "top_p", "max_turns")
        tail = ("max_response_tokens", "seed", "system_prompt", "reward")
        dumped = self.model_dump(mode="json", include={*keep, *tail, "use_tool", "code"})
        identity = {key: dumped[key] for key in (*keep, *tail)}
        if not self.use_tool:
            identity["use_tool"] = False
        if self.code != CodeSettings():
            identity["code"] = dumped["code"]
        if self.judge.url:
            identity["judge"] = {"url": self.judge.url, "model": self.judge.model}
        return identity

    def model_label(self) -> str:
        """The model's short name: its folder's name, or the endpoint's served model name."""
        model = self.model.path if isinstance(self.model, LocalModel) else self.model.model
        return Path(model.rstrip("/")).name or "endpoint"

    def run_dir(self) -> Path:
        if self.out:
            return Path(self.out)
        bench = Path(self.benchmark.name).stem
        return Path("runs") / "eval" / f"{bench}-{self.model_label()}"


def configs() -> list[str]:
    return CONFIGS.names()


def load_config(
    name: str | Path, base: dict[str, Any], overrides: list[str] | None = None
) -> EvalConfig:
    """A config file (a name in configs/ or a path) under `base` values (the command's MODEL and
    BENCH) and `a.b=value` overrides; ConfigError listing every mistake (rstar2_config.load)."""
    return load(EvalConfig, CONFIGS, name, overrides, base=base)
