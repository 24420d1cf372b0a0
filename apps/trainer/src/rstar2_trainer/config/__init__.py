"""`TrainerConfig`: the packages' configs composed into one, plus the run's own settings
(`sections.py`) and the cluster's (`cluster.py`, read by `placement/`).

Recipes are YAML files in `apps/trainer/configs/`; `load_config` reads one, applies `a.b=value`
overrides from the command line and validates the result (rstar2-config: every mistake one line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import (
    ConfigDict,
    Field,
    SerializationInfo,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from rstar2_algos import AlgoConfig, GrpoRocConfig
from rstar2_config import ConfigError as ConfigError  # raised by load_config
from rstar2_config import Recipes, Section, load, validate
from rstar2_curriculum import CurriculumConfig
from rstar2_rollout import (
    EngineConfig,
    RewardConfig,
    RolloutConfig,
    SchedulerConfig,
    VLLMEngineConfig,
)
from rstar2_sandbox import ChildSandboxConfig, SandboxBackendConfig, SandboxConfig
from rstar2_trainer.asyncsteps import AsyncConfig, check_async, off_policy_default
from rstar2_trainer.config.cluster import ClusterConfig as ClusterConfig
from rstar2_trainer.config.cluster import ClusterError as ClusterError
from rstar2_trainer.config.cluster import RemoteRolloutConfig as RemoteRolloutConfig
from rstar2_trainer.config.sections import (
    EvalSettings as EvalSettings,
)
from rstar2_trainer.config.sections import (
    HardPassConfig as HardPassConfig,
)
from rstar2_trainer.config.sections import (
    InitConfig as InitConfig,
)
from rstar2_trainer.config.sections import (
    LoraSettings as LoraSettings,
)
from rstar2_trainer.config.sections import (
    MlflowSettings as MlflowSettings,
)
from rstar2_trainer.config.sections import (
    ModelConfig as ModelConfig,
)
from rstar2_trainer.config.sections import (
    OptimConfig as OptimConfig,
)
from rstar2_trainer.config.sections import (
    PretrainedModelConfig as PretrainedModelConfig,
)
from rstar2_trainer.config.sections import (
    RunConfig as RunConfig,
)
from rstar2_trainer.config.sections import (
    ServiceConfig as ServiceConfig,
)
from rstar2_trainer.config.sections import (
    SFTConfig as SFTConfig,
)
from rstar2_trainer.config.sections import (
    TinyModelConfig as TinyModelConfig,
)
from rstar2_trainer.config.sections import (
    TrainSettings as TrainSettings,
)
from rstar2_trainer.config.sections import (
    WandbSettings as WandbSettings,
)
from rstar2_verify import VerifyConfig

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
if not CONFIG_DIR.is_dir():  # editable install: the recipes live beside src/
    CONFIG_DIR = Path(__file__).resolve().parents[3] / "configs"
RECIPES = Recipes(CONFIG_DIR)
RENAMED = {"engine.replicas": "engine_replicas (a top-level key)"}


class TrainerConfig(Section):
    """Everything `rstar2-train` needs, one section per package or phase."""

    # `async` is a Python keyword: the field is `async_`, written and read as `async`.
    model_config = ConfigDict(frozen=True, extra="forbid", serialize_by_alias=True)

    run: RunConfig = Field(default_factory=RunConfig, description="The run itself.")
    model: ModelConfig = Field(default_factory=TinyModelConfig, description="The policy model.")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="Non-reasoning SFT.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="RL optimizer.")
    train: TrainSettings = Field(
        default_factory=TrainSettings, description="Training device and precision."
    )
    engine: EngineConfig = Field(
        default_factory=VLLMEngineConfig,
        validate_default=True,  # the default engine takes train.dtype too
        description="The rollout engine, rstar2-rollout's `EngineConfig` (kind: vllm | hf); its "
        "model, context, seed and dtype are the run's unless set here (`engine_for`).",
    )
    engine_replicas: int = Field(
        default=1,
        gt=0,
        description="Local engines the scheduler spreads over (cluster: cluster.engines_per_node; "
        "remote: the workers' own).",
    )
    scheduler: SchedulerConfig = Field(
        default_factory=SchedulerConfig, description="Placement of trajectories on engines."
    )
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollouts.")
    algo: AlgoConfig = Field(default_factory=GrpoRocConfig, description="The RL algorithm.")
    curriculum: CurriculumConfig = Field(
        default_factory=CurriculumConfig, description="Data and stages."
    )
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig, description="Tool limits.")
    tool: SandboxBackendConfig = Field(
        default_factory=ChildSandboxConfig,
        description="Where tool calls run: child (a sandbox server started on loopback), "
        "remote (running servers), local (in this process), fusion (a SandboxFusion endpoint).",
    )
    verify: VerifyConfig = Field(default_factory=VerifyConfig, description="Grading limits.")
    reward: RewardConfig = Field(
        default_factory=RewardConfig, description="What is graded and how it becomes the reward."
    )
    verify_service: ServiceConfig = Field(
        default_factory=ServiceConfig, description="Where grading runs."
    )
    eval: EvalSettings = Field(default_factory=EvalSettings, description="Held-out evaluation.")
    hard_pass: HardPassConfig = Field(
        default_factory=HardPassConfig, description="Finding the hard subset for a hard stage."
    )
    cluster: ClusterConfig | None = Field(
        default=None, description="Run on a Ray cluster (docs/LAUNCH.md); None: this machine."
    )
    remote: RemoteRolloutConfig | None = Field(
        default=None,
        description="Roll out on remote workers instead of local engines; None: local engines.",
    )
    init: InitConfig | None = Field(
        default=None,
        description="Start from another run's checkpoint, skipping SFT (`--init-from "
        "RUN_DIR[:STEP]`); None: a fresh model.",
    )
    async_: AsyncConfig = Field(
        default_factory=AsyncConfig,
        alias="async",
        description="Asynchronous steps (max_staleness, partial_rollout); synchronous by default.",
    )

    @model_validator(mode="after")
    def _one_placement(self) -> TrainerConfig:
        if self.remote is not None and self.cluster is not None:
            raise ValueError("set cluster or remote, not both")
        return self

    @field_validator("engine")
    @classmethod
    def _engine_in_training_precision(cls, engine: Any, info: ValidationInfo) -> Any:
        # An engine with a dtype left unset takes train.dtype (checked below when it is set).
        train = info.data.get("train")
        return engine.fill(dtype=train.dtype) if isinstance(train, TrainSettings) else engine

    @field_serializer("engine")
    def _engine_as_written(self, engine: Any, info: SerializationInfo) -> dict[str, Any]:
        # What the recipe set, not the defaults: a reloaded config (`--resume`) fills the rest
        # exactly as the first run did (`engine_for`).
        return {"kind": engine.kind, **engine.model_dump(mode=info.mode, exclude_unset=True)}

    @model_validator(mode="after")
    def _only_what_the_trainer_honours(self) -> TrainerConfig:
        # Settings that would validate but do nothing, or fail only after SFT, are refused here.
        set_by_trainer = {
            "n": "algo.group_size x algo.oversample sets the rollouts per problem",
            "max_concurrency": "the scheduler admits rollouts by KV room (scheduler.*)",
            "max_response_tokens": "each stage sets it (curriculum.*.max_response_tokens)",
            "max_turns": "each stage sets it (curriculum stages)",
            "seed": "run.seed seeds every step",
        }
        for key, why in set_by_trainer.items():
            # A resolved config.yaml carries the defaults: only another value is a mistake.
            if getattr(self.rollout, key) != RolloutConfig.model_fields[key].default:
                raise ValueError(f"rollout.{key} is not read by the trainer: {why}; remove it")
        if getattr(self.algo, "kl_coef", 0.0) > 0:
            raise ValueError(
                "algo.kl_coef > 0 needs reference-model logprobs, which the trainer does not "
                "compute (the paper uses no KL); set algo.kl_coef: 0"
            )
        return self

    @model_validator(mode="after")
    def _async_is_what_is_built(self) -> TrainerConfig:
        check_async(self)
        default = off_policy_default(self)
        if default is not None:  # the algo section's default depends on the async one
            algo = self.algo.model_copy(update={"off_policy": default})
            object.__setattr__(self, "algo", algo)  # frozen: set once, while validating
        return self

    @model_validator(mode="after")
    def _engine_can_be_trained(self) -> TrainerConfig:
        engine = self.engine
        if not engine.takes_weight_updates:
            raise ValueError(
                f"engine.kind {engine.kind} cannot load the trainer's weights; "
                "use engine.kind: vllm or hf"
            )
        if getattr(engine, "model", None) is not None:
            raise ValueError(
                "engine.model: the engines run the policy being trained (the model section); "
                "remove engine.model"
            )
        # Rollout logprobs and the update must see one precision of the weights; a vLLM engine's
        # loader casts the synced fp32 master weights to its dtype, as autocast does in training.
        dtype = getattr(engine, "dtype", self.train.dtype)
        if dtype != self.train.dtype:
            raise ValueError(
                f"engine.dtype {dtype} differs from train.dtype {self.train.dtype}; "
                f"set engine.dtype: {self.train.dtype}"
            )
        needed = context_tokens(self)
        context = getattr(engine, "max_model_len", needed)
        if "max_model_len" in engine.model_fields_set and context < needed:
            raise ValueError(
                f"engine.max_model_len {context} is below the {needed} tokens the "
                "longest stage or evaluation needs (its budget + 1024); raise it or leave it unset"
            )
        return self

    @model_validator(mode="after")
    def _lora_can_be_served(self) -> TrainerConfig:
        lora = getattr(self.model, "lora", None)
        if lora is None or lora.sync == "merged":
            return self
        if self.remote is not None:
            raise ValueError(
                "model.lora.sync adapter: remote rollout services load full weights only; "
                "set model.lora.sync: merged"
            )
        cluster = self.cluster
        if cluster is not None and cluster.colocate and cluster.sleep_level == 2:
            raise ValueError(
                "model.lora.sync adapter with colocated engines: sleep level 2 drops the "
                "engines' base weights, which an adapter push does not bring back; set "
                "cluster.sleep_level: 1"
            )
        if self.init is not None and "optimizer" in self.init.include:
            raise ValueError(
                "a LoRA run's --init-from takes the origin's weights as its base and starts "
                "fresh adapters: drop optimizer from --init-include"
            )
        return self

    @model_validator(mode="after")
    def _engine_fits_the_cluster(self) -> TrainerConfig:
        if self.cluster is None:
            return self
        engine, cluster = self.engine, self.cluster
        explicit = {k: getattr(engine, k) for k in engine.model_fields_set}
        tp = max(1, cluster.gpus_per_engine)
        if explicit.get("tensor_parallel_size", tp) != tp:
            raise ValueError(
                f"engine.tensor_parallel_size differs from the {tp} GPU(s) of "
                "cluster.gpus_per_engine; leave it unset (the cluster sets it)"
            )
        if cluster.colocate and explicit.get("enable_sleep_mode") is False:
            raise ValueError(
                "cluster.colocate needs engines that sleep; remove engine.enable_sleep_mode"
            )
        return self

    def engine_for(self, model_dir: str, replica: int, **placement: Any) -> EngineConfig:
        """Replica `replica`'s engine config: what the recipe left unset is the run's (the
        policy's folder, the context of `context_tokens`, the seed run.seed + replica) or the
        placement's (a cluster's tensor parallelism and sleep mode)."""
        lora = getattr(self.model, "lora", None)
        if lora is not None and lora.sync == "adapter":  # serve the base with LoRA enabled
            placement.setdefault("max_lora_rank", lora.rank)
        return self.engine.fill(
            model=model_dir,
            max_model_len=context_tokens(self),
            seed=self.run.seed + replica,
            at_push=self.async_.at_push,
            **placement,
        )


def context_tokens(config: TrainerConfig) -> int:
    """Engine context: the longest response budget of any stage or evaluation, plus the prompt."""
    from rstar2_curriculum import StagePlan

    longest = max(s.max_response_tokens for s in StagePlan.from_config(config.curriculum).stages)
    longest = max(longest, config.eval.max_response_tokens)
    if config.eval.sources:  # benchmark files are evaluated with their own budget
        longest = max(longest, config.eval.benchmark.max_response_tokens)
    return longest + 1024


def recipes() -> list[str]:
    return RECIPES.names()


def validate_config(tree: dict[str, Any], source: str) -> TrainerConfig:
    """`tree` as a `TrainerConfig`; ConfigError listing every mistake, one line each."""
    return validate(TrainerConfig, tree, source, RENAMED)


def load_config(recipe: str | Path = "tiny", overrides: list[str] | None = None) -> TrainerConfig:
    """Read a recipe (a name in configs/ or a path), apply `a.b=value` overrides (a number indexes
    a list: `curriculum.tiny.steps.1=5`; `model.kind=pretrained` switches the section), validate;
    ConfigError listing every mistake (rstar2_config.load)."""
    return load(TrainerConfig, RECIPES, recipe, overrides, renamed=RENAMED)
