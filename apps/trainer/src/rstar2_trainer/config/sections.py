"""The sections of `TrainerConfig` that are the trainer's own: the run, the model, SFT, the
optimizer, the training device, the child services, the hard-subset pass, evaluation and
`--init-from`. `rstar2_trainer.config` composes them with the packages' configs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from rstar2_config import ConfigError as ConfigError  # raised by load_config
from rstar2_config import Section
from rstar2_curriculum import SFTSources
from rstar2_rollout import (
    RewardConfig,
    SamplingProtocol,
)

_Section = Section  # the sections below: frozen, unknown keys refused


class WandbSettings(_Section):
    """The Weights & Biases run (`run.trackers` has wandb); its files go under RUN_DIR/wandb."""

    project: str = Field(default="rstar2", description="wandb project.")
    entity: str | None = Field(default=None, description="wandb team or user; unset: yours.")
    mode: Literal["online", "offline"] | None = Field(
        default=None,
        description="offline: write the run to RUN_DIR/wandb only (upload later with `wandb "
        "sync`); unset: wandb's own choice (WANDB_MODE, else online).",
    )


class MlflowSettings(_Section):
    """The MLflow run (`run.trackers` has mlflow)."""

    tracking_uri: str | None = Field(
        default=None,
        description="Where MLflow keeps runs (http://host:port, sqlite:///path.db, "
        "file:///dir); unset: a file store in RUN_DIR/mlruns.",
    )
    experiment: str = Field(default="rstar2", description="MLflow experiment of the run.")


class RunConfig(_Section):
    """Where the run writes and how it is seeded."""

    name: str = Field(default="tiny", description="A label for the run.")
    output_dir: Path | None = Field(
        default=None, description="Run directory; a new folder under runs/ when unset."
    )
    runs_root: Path = Field(default=Path("runs"), description="Parent of new run directories.")
    seed: int = Field(default=0, description="The run seed; every other seed derives from it.")
    threads: int | Literal["auto"] = Field(
        default="auto",
        description="torch threads of the trainer process (SFT, the update, an in-process "
        "engine); auto: every core this process may run on.",
    )
    checkpoint_every: int = Field(default=1, gt=0, description="RL steps between checkpoints.")
    keep_checkpoints: int = Field(
        default=2,
        gt=0,
        description="Checkpoints kept on disk; older ones are removed only after a newer one is "
        "complete, so the newest good one is never removed.",
    )
    max_restarts: int = Field(
        default=3,
        ge=0,
        description="Times the run restarts itself after a failure it can recover from (a dead "
        "rank or actor, a collective that timed out, an out-of-memory, a lost node, a service "
        "dead for good), each time from the newest good checkpoint as --resume does; 0: the "
        "run ends on the first one.",
    )
    preempt_grace_s: float = Field(
        default=300.0,
        gt=0,
        description="Seconds between a SIGTERM and the exit: the run stops at the end of its "
        "step, writes a checkpoint, exits 0 and prints the resume command; a step that cannot "
        "end in time is dropped and the run exits from its last checkpoint.",
    )
    service_restarts: int = Field(
        default=5,
        ge=0,
        description="Times each child service (the sandbox and verify servers) is started again "
        "when it dies; its calls in flight are sent again. 0: never (a dead service then restarts "
        "the whole run, as run.max_restarts allows).",
    )
    service_retry_s: float = Field(
        default=60.0,
        ge=0,
        description="Seconds a call to a service that is down is sent again (while it restarts) "
        "before it counts as failed.",
    )
    trackers: list[Literal["jsonl", "tensorboard", "wandb", "mlflow"]] = Field(
        default=["jsonl", "tensorboard"],
        description="Where metrics, the resolved config and the plots go, any of jsonl "
        "(RUN_DIR/metrics.jsonl), tensorboard (RUN_DIR/tb), wandb, mlflow (the last two need "
        "the trainer's extra of that name).",
    )
    wandb: WandbSettings = Field(
        default_factory=WandbSettings, description="The wandb tracker's run."
    )
    mlflow: MlflowSettings = Field(
        default_factory=MlflowSettings, description="The mlflow tracker's run."
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info",
        description="Level of RUN_DIR/logs/run.log, where the libraries (vLLM, Ray, "
        "transformers, torch) and child processes write; the terminal keeps the trainer's "
        "progress, its warnings and errors.",
    )
    plots: bool = Field(default=True, description="Draw PNG plots of the main curves at the end.")

    @model_validator(mode="before")
    @classmethod
    def _tensorboard_flag(cls, data: Any) -> Any:
        """`tensorboard: true|false` (configs saved before run.trackers) as its trackers list."""
        if not isinstance(data, dict) or "tensorboard" not in data:
            return data
        data = dict(data)
        flag = data.pop("tensorboard")
        if "trackers" in data:
            raise ValueError("run.tensorboard is replaced by run.trackers; drop run.tensorboard")
        data["trackers"] = ["jsonl", "tensorboard"] if flag else ["jsonl"]
        return data

    @field_validator("threads", mode="before")
    @classmethod
    def _count_or_auto(cls, threads: Any) -> Any:
        if threads == "auto":
            return threads
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"set a number of threads (at least 1) or auto, not {threads!r}")
        return threads

    @property
    def torch_threads(self) -> int:
        """`threads` as a number: auto is the cores this process may run on."""
        if self.threads != "auto":
            return self.threads
        if hasattr(os, "sched_getaffinity"):  # Linux: the cores this process is allowed
            return len(os.sched_getaffinity(0))
        return os.cpu_count() or 1

    @field_validator("trackers")
    @classmethod
    def _once_each(cls, trackers: list[str]) -> list[str]:
        if len(set(trackers)) != len(trackers):
            raise ValueError("name each tracker once")
        return trackers


class LoraSettings(_Section):
    """A LoRA policy (PEFT): the base frozen in train.dtype, adapters and their AdamW in fp32."""

    rank: int = Field(gt=0, le=512, description="Adapter rank r.")
    alpha: float = Field(
        default=32.0, gt=0, description="Scale numerator: the update is (alpha / rank) B A."
    )
    dropout: float = Field(
        default=0.0, ge=0, lt=1, description="Dropout on the adapter's input (0: none)."
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        default="all-linear",
        description="Linear layers that get adapters: all-linear (every linear layer of the "
        "blocks, not the head) or module names, e.g. [q_proj, v_proj].",
    )
    sync: Literal["adapter", "merged"] = Field(
        default="adapter",
        description="What a push moves: adapter (the engines serve the base with LoRA enabled "
        "and load each new adapter version; megabytes), or merged (base + adapter as full "
        "weights, for engines without LoRA).",
    )
    seed: int = Field(default=0, description="Seed of the adapters' initial A matrices.")


class TinyModelConfig(_Section):
    """A small Qwen3-architecture model and BPE tokenizer built on the spot (no download)."""

    kind: Literal["tiny"] = "tiny"
    vocab_size: int = Field(default=2048, gt=256, description="BPE vocabulary size.")
    hidden_size: int = Field(default=128, gt=0, description="Model width.")
    layers: int = Field(default=4, gt=0, description="Transformer blocks.")
    heads: int = Field(default=4, gt=0, description="Attention heads (head size = width/heads).")
    kv_heads: int = Field(default=2, gt=0, description="Key/value heads (GQA).")
    max_position_embeddings: int = Field(default=4096, gt=0, description="Longest context.")
    lora: LoraSettings | None = Field(
        default=None, description="Train LoRA adapters instead of the full weights; None: full."
    )


class PretrainedModelConfig(_Section):
    """A local Hugging Face-format folder (or a hub id where downloads work)."""

    kind: Literal["pretrained"] = "pretrained"
    path: str = Field(description="Folder with config.json, weights and tokenizer.")
    lora: LoraSettings | None = Field(
        default=None, description="Train LoRA adapters instead of the full weights; None: full."
    )


ModelConfig = Annotated[TinyModelConfig | PretrainedModelConfig, Field(discriminator="kind")]


class SFTConfig(_Section):
    """Non-reasoning SFT: tool-call chat data (`source`), or synthetic traces (the tiny recipe)."""

    enabled: bool = Field(default=True, description="Run SFT before RL.")
    source: SFTSources = Field(
        default=(),
        description="SFT data: PATH (one chat-format JSONL/Parquet file), or a list of sources "
        "{path, format, weight, split, limit}; empty: synthetic traces.",
    )
    examples: int = Field(default=1200, gt=0, description="Synthetic traces to train on.")
    failure_rate: float = Field(
        default=0.3, ge=0, le=1, description="Share of traces whose first tool call fails."
    )
    check_failure_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of traces that, after the working program, run a check in a second "
        "call that fails (nothing carries over between calls) and answer anyway.",
    )
    direct_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="Share of traces that answer without the tool (RL then has to teach it).",
    )
    difficulty: Literal[1, 2, 3, "mixed"] = Field(
        default="mixed", description="Difficulty of the synthetic problems the traces solve."
    )
    epochs: int = Field(default=3, gt=0, description="Passes over the traces.")
    batch_size: int = Field(default=16, gt=0, description="Sequences per optimizer step.")
    micro_batch_tokens: int = Field(
        default=4096,
        gt=0,
        description="Tokens per forward pass: a step's sequences are packed, longest first, into "
        "micro-batches of at most this many of their own tokens (a longer one alone; gradient "
        "accumulation over them).",
    )
    lr: float = Field(default=3e-3, gt=0, description="Peak learning rate.")
    warmup_ratio: float = Field(default=0.04, ge=0, le=1, description="Warm-up share of steps.")


class OptimConfig(_Section):
    """The RL optimizer: AdamW, linear warm-up then constant (the paper's schedule)."""

    lr: float = Field(default=1e-6, gt=0, description="Learning rate after warm-up.")
    warmup_steps: int = Field(default=20, ge=0, description="RL steps of linear warm-up.")
    weight_decay: float = Field(default=0.01, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field(default=(0.9, 0.999), description="AdamW betas.")
    grad_clip: float = Field(default=1.0, gt=0, description="Global gradient-norm clip.")
    micro_batch_tokens: int = Field(
        default=16384,
        gt=0,
        description="Tokens per forward/backward micro-batch: the rows' own, packed into one "
        "sequence (a longer row alone).",
    )
    mini_batches: int = Field(
        default=1,
        gt=0,
        description="Optimizer steps per pass over the kept batch (PPO mini-batches); 1: one.",
    )
    epochs: int = Field(
        default=1, gt=0, description="Passes over the kept batch per RL step (PPO epochs)."
    )


class TrainSettings(_Section):
    """Where and in what precision the policy trains (SFT and RL updates alike)."""

    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="auto: the first GPU when one is visible (CUDA or ROCm), else cpu.",
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="bfloat16: autocast forward/backward, fp32 master weights and optimizer state.",
    )


class ServiceConfig(_Section):
    """How the trainer reaches a service: a child server on loopback, an address, or in-process."""

    mode: Literal["child", "address", "local"] = Field(
        default="child", description="child: start `serve` on loopback; address: connect to one."
    )
    address: str | None = Field(default=None, description="host:port when mode is address.")
    port: int = Field(default=0, ge=0, le=65535, description="Port of a child server; 0: free.")
    workers: int = Field(default=2, gt=0, description="Worker processes of a child server.")
    token_file: str | None = Field(
        default=None, description="Token file (0600) of the server when mode is address."
    )

    @model_validator(mode="after")
    def _address_with_its_mode(self) -> ServiceConfig:
        if self.mode == "address" and not self.address:
            raise ValueError("mode address needs an address: set address: host:port")
        if self.mode != "address" and self.address:
            raise ValueError(f"address is only read in mode address (mode is {self.mode})")
        return self


class HardPassConfig(_Section):
    """How a stage on the hard subset (`data: hard`) finds it when it starts."""

    mode: Literal["rollouts", "history"] = Field(
        default="rollouts",
        description="rollouts: the paper's pass, k fresh rollouts of every problem with the "
        "current policy, dropping those solved k/k; history: the latest k training outcomes.",
    )
    chunk_problems: int = Field(
        default=256, gt=0, description="Problems per round of the pass (progress is kept)."
    )


class EvalSettings(_Section):
    """Says when and how the trainer measures accuracy during a run (the YAML section `eval:`).

    The run evaluates on held-out synthetic problems and/or benchmark files after SFT, at each
    stage switch (or after the last stage only) and, if asked, before SFT.
    """

    problems: int = Field(default=48, gt=0, description="Held-out synthetic problems.")
    seed: int = Field(default=1_000_003, description="Seed of the held-out set (not training's).")
    difficulty: Literal[1, 2, 3, "mixed"] = Field(
        default="mixed", description="Difficulty of the held-out synthetic problems."
    )
    temperature: float = Field(default=0.0, ge=0, description="0: greedy.")
    samples: int = Field(
        default=1,
        gt=0,
        description="Trajectories per problem; accuracy is their mean (the paper's avg@k).",
    )
    max_turns: int = Field(default=4, gt=0, description="Turns per evaluation trajectory.")
    max_response_tokens: int = Field(default=384, gt=0, description="Response budget.")
    before_sft: bool = Field(
        default=False,
        description="Also evaluate before SFT (the untrained model; it teaches nothing).",
    )
    every_stage: bool = Field(
        default=True,
        description="Evaluate at every stage switch; false: after SFT and after the last "
        "stage only.",
    )
    synthetic: bool = Field(
        default=True, description="Evaluate on held-out synthetic problems (the tiny recipe)."
    )
    sources: list[str] = Field(
        default_factory=list,
        description="Benchmarks, each reported as avg@k: a name graded by answer (aime24, "
        "gpqa_diamond, ...; `rstar2-eval benchmarks`), NAME=PATH for its local copy in the "
        "published format, or a JSONL/Parquet file with question and answer.",
    )
    benchmark: SamplingProtocol = Field(
        default_factory=SamplingProtocol,
        description="How the benchmark files are sampled and scored (the paper's protocol, "
        "rstar2-eval's keys).",
    )

    def protocol(self, *, top_p: float, reward: RewardConfig) -> SamplingProtocol:
        """The held-out evaluation as a sampling protocol (top-p and reward are the run's)."""
        return SamplingProtocol(
            samples=self.samples,
            temperature=self.temperature,
            top_p=top_p,
            max_turns=self.max_turns,
            max_response_tokens=self.max_response_tokens,
            seed=self.seed,
            reward=reward,
        )

    @model_validator(mode="after")
    def _samples_need_sampling(self) -> EvalSettings:
        if self.samples > 1 and self.temperature == 0:
            raise ValueError(
                f"eval.samples={self.samples} with greedy decoding repeats one answer; "
                "set eval.temperature above 0 (the paper evaluates at 0.6) or eval.samples=1"
            )
        return self


class InitConfig(_Section):
    """A new run that starts from another run's checkpoint instead of SFT (`--init-from`)."""

    run: Path = Field(description="The run directory whose checkpoint the policy starts from.")
    step: int | None = Field(
        default=None,
        ge=0,
        description="The checkpoint's RL step; None: the latest (the new run records the step).",
    )
    include: list[Literal["optimizer", "curriculum"]] = Field(
        default_factory=list,
        description="Also take the checkpoint's optimizer state (AdamW moments) and/or its "
        "curriculum state (stage, data position, difficulty); the weights always.",
    )
