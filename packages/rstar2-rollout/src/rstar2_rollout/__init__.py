"""rstar2-rollout: multi-turn agentic rollouts, inference engines and the scheduler."""

from rstar2_rollout.adapter import Adapter
from rstar2_rollout.chat import (
    PYTHON_TOOL,
    TOOL_NAME,
    ChatFormat,
    encode_conversation,
    system_prompt,
    wrap_question,
)
from rstar2_rollout.client import RolloutClient, RolloutError, WeightUpdate
from rstar2_rollout.collect import Collected, Meter, collect
from rstar2_rollout.config import (
    EngineConfig,
    HFEngineConfig,
    KVAwarePolicy,
    LeastRequestsPolicy,
    OpenAIEngineConfig,
    RequestLimits,
    RolloutConfig,
    SchedulerConfig,
    VLLMEngineConfig,
)
from rstar2_rollout.engine import (
    AdapterEngine,
    Engine,
    EngineProgress,
    Generation,
    KVCapacity,
    ProgressEngine,
    SamplingParams,
    SleepingEngine,
    StreamingEngine,
)
from rstar2_rollout.engines import build_engine
from rstar2_rollout.groups import (
    GatedSource,
    GradedGroups,
    Group,
    SampleSource,
    Scorer,
    Submission,
    TrajectorySource,
)
from rstar2_rollout.loop import ProblemLike, RolloutTask, derive_seed, format_tool_result, run_agent
from rstar2_rollout.pool import Pending, RolloutPool
from rstar2_rollout.protocol import RewardConfig, SamplingProtocol
from rstar2_rollout.scheduler import EngineStatus, Job, JobResult, Scheduler
from rstar2_rollout.server import start_server
from rstar2_rollout.service import (
    RolloutResult,
    RolloutSampling,
    RolloutService,
    agent_producer,
    one_engine_service,
)
from rstar2_rollout.toolcall import ParsedTurn, ToolCallRequest, parse_turn, render_call
from rstar2_rollout.trajectory import (
    FinishReason,
    Timings,
    ToolCallRecord,
    ToolOutcome,
    Trajectory,
    staleness_stats,
)
from rstar2_rollout.weights import InvalidWeights, WeightSpec

__all__ = [
    "PYTHON_TOOL",
    "TOOL_NAME",
    "Adapter",
    "AdapterEngine",
    "ChatFormat",
    "Collected",
    "Engine",
    "EngineConfig",
    "EngineProgress",
    "EngineStatus",
    "FinishReason",
    "GatedSource",
    "Generation",
    "GradedGroups",
    "Group",
    "HFEngineConfig",
    "InvalidWeights",
    "Job",
    "JobResult",
    "KVAwarePolicy",
    "KVCapacity",
    "LeastRequestsPolicy",
    "Meter",
    "OpenAIEngineConfig",
    "ParsedTurn",
    "Pending",
    "ProblemLike",
    "ProgressEngine",
    "RequestLimits",
    "RewardConfig",
    "RolloutClient",
    "RolloutConfig",
    "RolloutError",
    "RolloutPool",
    "RolloutResult",
    "RolloutSampling",
    "RolloutService",
    "RolloutTask",
    "SampleSource",
    "SamplingParams",
    "SamplingProtocol",
    "Scheduler",
    "SchedulerConfig",
    "Scorer",
    "SleepingEngine",
    "StreamingEngine",
    "Submission",
    "Timings",
    "ToolCallRecord",
    "ToolCallRequest",
    "ToolOutcome",
    "Trajectory",
    "TrajectorySource",
    "VLLMEngineConfig",
    "WeightSpec",
    "WeightUpdate",
    "agent_producer",
    "build_engine",
    "collect",
    "derive_seed",
    "encode_conversation",
    "format_tool_result",
    "one_engine_service",
    "parse_turn",
    "render_call",
    "run_agent",
    "staleness_stats",
    "start_server",
    "system_prompt",
    "wrap_question",
]
