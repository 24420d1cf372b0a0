"""Configuration of the data pipeline and the stage plan.

One root model, `CurriculumConfig`, composed of the smaller models below: where problems come
from (`SourceConfig`, a union on `kind`), how they are cleaned (`CleanConfig`), how they are
weighted by difficulty (`DifficultyConfig`) and which stage plan runs (`plan`, or custom
`stages`). Defaults, bounds and a line of documentation per field live here and only here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PositiveInt, model_validator

Preset = Literal["dapo", "openmathreasoning", "project_euler", "verl"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# ---------------------------------------------------------------------------- data sources


class FieldMap(_Frozen):
    """Which row fields hold a problem's parts; dotted paths reach into nested objects."""

    question: str = Field(default="question", description="Field with the problem text.")
    answer: str = Field(default="answer", description="Field with the reference answer.")
    id: str | None = Field(
        default="id", description="Field with a stable id; None (or absent): '<source>/<row>'."
    )
    source: str | None = Field(
        default=None, description="Field naming the row's origin; None: the loader's source."
    )
    metadata: tuple[str, ...] = Field(
        default=(), description="Further fields copied into Problem.metadata when present."
    )
    metadata_object: str | None = Field(
        default="metadata", description="A field holding an object merged into Problem.metadata."
    )


def _check_preset(source: Any) -> Any:
    # A written config (the trainer's config.yaml) holds the default `fields` beside the preset.
    if (
        source.preset is not None
        and "fields" in source.model_fields_set
        and source.fields != FieldMap()
    ):
        raise ValueError("give either `preset` or `fields`, not both")
    return source


class SyntheticSource(_Frozen):
    """Problems made by `generate_problems` (no files needed)."""

    kind: Literal["synthetic"] = "synthetic"
    n: int = Field(default=512, gt=0, description="Problems to generate.")
    difficulty: Literal[1, 2, 3, "mixed"] = Field(
        default="mixed", description="1 easy .. 3 hard, or 'mixed' (uniform over the three)."
    )
    families: tuple[str, ...] = Field(
        default=(), description="Restrict to these problem families; empty: all of them."
    )


class JsonlSource(_Frozen):
    """One JSON object per line."""

    kind: Literal["jsonl"] = "jsonl"
    path: str = Field(description="Path of the .jsonl file.")
    fields: FieldMap = Field(default_factory=FieldMap, description="Row-to-Problem mapping.")
    preset: Preset | None = Field(
        default=None, description="A named row mapping (dapo, verl, ...) instead of `fields`."
    )
    source: str = Field(default="", description="Source label; empty: the file's stem.")

    @model_validator(mode="after")
    def _preset_or_fields(self) -> Any:
        return _check_preset(self)


class ParquetSource(_Frozen):
    """A Parquet file (needs the `parquet` extra)."""

    kind: Literal["parquet"] = "parquet"
    path: str = Field(description="Path of the .parquet file.")
    fields: FieldMap = Field(default_factory=FieldMap, description="Row-to-Problem mapping.")
    preset: Preset | None = Field(
        default=None, description="A named row mapping (dapo, verl, ...) instead of `fields`."
    )
    source: str = Field(default="", description="Source label; empty: the file's stem.")

    @model_validator(mode="after")
    def _preset_or_fields(self) -> Any:
        return _check_preset(self)


class HFSource(_Frozen):
    """A Hugging Face dataset (needs the `hf` extra)."""

    kind: Literal["hf"] = "hf"
    path: str = Field(
        description="A directory written by save_to_disk, a builder name ('json', 'parquet') "
        "used with data_files, or a hub name (only where the machine is online)."
    )
    split: str = Field(default="train", description="Split to read.")
    data_files: tuple[str, ...] = Field(default=(), description="Files for a builder name.")
    name: str | None = Field(default=None, description="Dataset configuration name.")
    cache_dir: str | None = Field(
        default=None, description="Where `load_dataset` caches; None: the datasets default."
    )
    fields: FieldMap = Field(default_factory=FieldMap, description="Row-to-Problem mapping.")
    preset: Preset | None = Field(
        default=None, description="A named row mapping (dapo, verl, ...) instead of `fields`."
    )
    source: str = Field(default="", description="Source label; empty: the path's last part.")

    @model_validator(mode="after")
    def _preset_or_fields(self) -> Any:
        return _check_preset(self)


class BenchmarkConfig(_Frozen):
    """Which evaluation problems: a named benchmark (`benchmarks.BENCHMARKS`), or a file."""

    name: str = Field(
        description="A benchmark's name (`rstar2-eval benchmarks` lists them), or a .jsonl / "
        ".parquet path."
    )
    data: str | None = Field(
        default=None,
        description="A local copy of a named benchmark in its published format (offline "
        "machines): a file, or a folder for benchmarks published as several files.",
    )
    question_field: str | None = Field(
        default=None, description="Row field with the problem; None: the benchmark's own."
    )
    answer_field: str | None = Field(
        default=None, description="Row field with the reference answer; None: the benchmark's."
    )
    id_field: str | None = Field(
        default=None, description="Row field with a unique id; None: the benchmark's, or row order."
    )
    limit: int | None = Field(default=None, gt=0, description="Evaluate only the first N problems.")


SourceConfig = Annotated[
    SyntheticSource | JsonlSource | ParquetSource | HFSource, Field(discriminator="kind")
]


# ---------------------------------------------------------------------------- SFT data

SFTFormat = Literal[
    "auto", "chat", "function_call", "openai", "sharegpt", "glaive", "xlam", "instruction"
]


class SFTSourceConfig(_Frozen):
    """One SFT data source: a file or a saved dataset, its row format and its share."""

    path: str = Field(description="A .jsonl or .parquet file, or a save_to_disk folder.")
    format: SFTFormat = Field(
        default="auto",
        description="chat: this package's SFT rows; openai/sharegpt/glaive/xlam/instruction: a "
        "converter's source format; function_call: any of the function-calling ones; auto: "
        "told apart per row.",
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        description="Uses of each example per epoch: 2 repeats every example, 0.5 keeps a "
        "seeded random half.",
    )
    split: str = Field(default="train", description="Split of a saved DatasetDict.")
    limit: int | None = Field(
        default=None, gt=0, description="Keep at most this many valid examples (file order)."
    )
    assistant: Literal["wrap", "require"] = Field(
        default="wrap",
        description="Assistant turns without the <reason> prefix: wrap them in the paper's turn "
        "shape, or skip the row (require).",
    )
    name: str = Field(default="", description="Label in reports and ids; empty: the file stem.")


def _as_sources(value: Any) -> Any:
    """`PATH` (one chat-format source), one source, or a list of paths / sources."""
    if isinstance(value, str):
        return (SFTSourceConfig(path=value, format="chat"),) if value else ()
    if isinstance(value, dict | SFTSourceConfig):
        return (value,)
    if isinstance(value, list | tuple):
        return tuple(
            SFTSourceConfig(path=v, format="chat") if isinstance(v, str) else v for v in value
        )
    return value


SFTSources = Annotated[tuple[SFTSourceConfig, ...], BeforeValidator(_as_sources)]
"""A field type for apps: accepts `PATH`, a source, or a list of paths and sources."""


# ---------------------------------------------------------------------------- label check


class LabelCheckConfig(_Frozen):
    """The paper's label check: sample k answers per problem, keep it when m agree with the label."""

    k: int = Field(default=16, gt=0, description="Samples per problem (paper: 16, Qwen3-32B).")
    m: int = Field(default=2, gt=0, description="Samples that must match the label (paper: 2).")
    mode: Literal["plain", "agent"] = Field(
        default="plain",
        description="plain: one turn with the paper's system prompt and no tool; agent: the "
        "rollout package's agent loop with the Python tool (needs a sandbox).",
    )
    temperature: float = Field(default=0.6, ge=0, description="Sampling temperature.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling mass.")
    max_response_tokens: int = Field(
        default=8192, gt=0, description="Response budget per sample (all turns in agent mode)."
    )
    max_turns: int = Field(default=10, gt=0, description="Turns per sample in agent mode.")
    system_prompt: Literal["paper", "compact"] = Field(
        default="paper", description="The paper's system prompt, or the compact one (tiny models)."
    )
    max_concurrency: int = Field(default=64, gt=0, description="Samples in flight at once.")
    seed: int = Field(default=0, description="Seed; per-sample seeds derive from it.")

    @model_validator(mode="after")
    def _m_at_most_k(self) -> LabelCheckConfig:
        if self.m > self.k:
            raise ValueError(f"m ({self.m}) cannot exceed k ({self.k})")
        return self


# ---------------------------------------------------------------------------- cleaning


class CleanConfig(_Frozen):
    """The paper's cleaning rules (section 4); each can be turned off."""

    integer_answers: bool = Field(default=True, description="Keep only integer answers.")
    max_answer_digits: int = Field(
        default=30, gt=0, description="Drop integer answers with more digits (verifier limits)."
    )
    max_answer_chars: int = Field(
        default=64, gt=0, description="Drop any answer longer than this after normalisation."
    )
    drop_compound: bool = Field(
        default=True, description="Drop answers with several parts ('P = 54, A = 180')."
    )
    drop_unverifiable: bool = Field(
        default=True, description="Drop answers such as 'the limit does not exist'."
    )
    dedup: bool = Field(default=True, description="Drop repeats of a normalised question.")
    decontaminate_ngram: int = Field(
        default=8, ge=0, description="n of the n-gram overlap test against eval sets; 0: off."
    )


# ---------------------------------------------------------------------------- difficulty


class DifficultyConfig(_Frozen):
    """Per-problem pass-rate tracking and sampling by difficulty."""

    window: int = Field(
        default=32, gt=0, description="Latest rewards kept per problem for the k-of-k test."
    )
    prior: float = Field(
        default=0.5, ge=0, le=1, description="Pass rate assumed for a problem never seen."
    )
    weighting: Literal["uniform", "inverse_pass", "variance"] = Field(
        default="uniform",
        description="uniform: epoch order; inverse_pass: weight 1-p; variance: weight p(1-p).",
    )
    floor: float = Field(
        default=0.05, gt=0, le=1, description="Smallest weight, so no problem is starved."
    )


# ---------------------------------------------------------------------------- stage plan

Metric = Literal["all_correct_share", "all_wrong_share", "truncation_ratio", "reward_mean"]


class ThresholdTrigger(_Frozen):
    """Fires when the mean of a metric over the last `window` steps crosses a threshold."""

    kind: Literal["threshold"] = "threshold"
    metric: Metric = Field(description="Step metric to watch.")
    op: Literal["above", "below"] = Field(description="Fire when the mean is >= / <= it.")
    threshold: float = Field(description="The boundary.")
    window: int = Field(default=1, gt=0, description="Steps averaged.")


class PlateauTrigger(_Frozen):
    """Fires when a metric's mean over the last `window` steps improved on the previous
    `window` steps by less than `min_delta` (needs 2*window steps in the stage)."""

    kind: Literal["plateau"] = "plateau"
    metric: Metric = Field(default="reward_mean", description="Step metric to watch.")
    window: int = Field(default=10, gt=0, description="Steps per compared window.")
    min_delta: float = Field(default=0.01, ge=0, description="Improvement that is not a plateau.")


Trigger = Annotated[ThresholdTrigger | PlateauTrigger, Field(discriminator="kind")]


class Stage(_Frozen):
    """One RL stage: budgets, data, and when it ends."""

    name: str = Field(description="Label in logs and checkpoints.")
    max_response_tokens: int = Field(gt=0, description="Response budget across all turns.")
    max_turns: int = Field(gt=0, description="Assistant turns per trajectory.")
    data: Literal["all", "hard"] = Field(
        default="all", description="all: the cleaned set; hard: drop problems solved k of k."
    )
    hard_k: int = Field(default=8, gt=0, description="k of the k-of-k filter for data='hard'.")
    steps: int = Field(gt=0, description="Step budget; the stage ends after this many steps.")
    triggers: tuple[Trigger, ...] = Field(
        default=(), description="Metric rules that end the stage early (any one suffices)."
    )
    min_steps: int = Field(default=0, ge=0, description="No trigger fires before this step.")
    reset_optimizer: bool = Field(default=False, description="Reset optimizer state on entry.")
    update_reference: bool = Field(
        default=False, description="Make the latest policy the reference model on entry."
    )


class TinyPlanConfig(_Frozen):
    """Shape of the `tiny` plan: three short stages for a 2-core CPU run."""

    steps: tuple[PositiveInt, PositiveInt, PositiveInt] = Field(
        default=(4, 4, 4), description="Steps per stage."
    )
    max_response_tokens: tuple[PositiveInt, PositiveInt, PositiveInt] = Field(
        default=(192, 320, 320), description="Response budget per stage."
    )
    max_turns: tuple[PositiveInt, PositiveInt, PositiveInt] = Field(
        default=(3, 3, 4), description="Turns per stage."
    )
    hard_k: int = Field(default=4, gt=0, description="k of the stage-3 k-of-k filter.")


# ---------------------------------------------------------------------------- root


class CurriculumConfig(_Frozen):
    """Where problems come from, how they are cleaned, batched, and staged."""

    batch_size: int = Field(default=8, gt=0, description="Prompts per RL step.")
    seed: int = Field(default=0, description="Seed of the data order.")
    source: SourceConfig = Field(
        default_factory=SyntheticSource, description="Where the training problems come from."
    )
    eval_sources: tuple[SourceConfig, ...] = Field(
        default=(), description="Evaluation sets to decontaminate against."
    )
    clean: CleanConfig = Field(default_factory=CleanConfig, description="Cleaning rules.")
    difficulty: DifficultyConfig = Field(
        default_factory=DifficultyConfig, description="Difficulty tracking and weighting."
    )
    plan: Literal["paper", "tiny", "custom"] = Field(
        default="tiny", description="Named stage plan, or 'custom' to use `stages`."
    )
    tiny: TinyPlanConfig = Field(
        default_factory=TinyPlanConfig, description="Shape of the 'tiny' plan."
    )
    stages: tuple[Stage, ...] = Field(default=(), description="The stages of a 'custom' plan.")

    @model_validator(mode="after")
    def _custom_has_stages(self) -> CurriculumConfig:
        if (self.plan == "custom") != bool(self.stages):
            raise ValueError("give `stages` exactly when plan='custom'")
        return self
