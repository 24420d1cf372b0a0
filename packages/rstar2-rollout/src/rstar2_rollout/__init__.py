"""rstar2-rollout: multi-turn agentic rollouts, inference engines and the scheduler."""

from rstar2_rollout.chat import (
    PYTHON_TOOL,
    TOOL_NAME,
    ChatFormat,
    encode_conversation,
    system_prompt,
    wrap_question,
)
from rstar2_rollout.client import RolloutClient, RolloutError, WeightUpdate
from rstar2_rollout.config import (
    CacheAwarePolicy,
    EngineConfig,
    ForecastPolicy,
    HFEngineConfig,
    KVAwarePolicy,
    KVProgressPolicy,
    LeastRequestsPolicy,
    LeastTokensPolicy,
    OpenAIEngineConfig,
    PowerOfTwoPolicy,
    RolloutConfig,
    SchedulerConfig,
    StaticPolicy,
    VLLMEngineConfig,
    WorkerConfig,
)
from rstar2_rollout.engine import (
    Engine,
    EngineProgress,
    Generation,
    KVCapacity,
    ProgressEngine,
    SamplingParams,
    SleepingEngine,
)
from rstar2_rollout.engines import build_engine
from rstar2_rollout.loop import Problem, Rollout, format_tool_result, run_agent
from rstar2_rollout.scheduler import EngineStatus, Job, JobResult, Scheduler
from rstar2_rollout.server import start_server
from rstar2_rollout.toolcall import ParsedTurn, ToolCallRequest, parse_turn, render_call
from rstar2_rollout.trajectory import FinishReason, Timings, ToolCallRecord, ToolOutcome, Trajectory
from rstar2_rollout.weights import InvalidWeights, WeightSpec
from rstar2_rollout.worker import RolloutSampling, RolloutWorker, WorkerResult, agent_producer

__all__ = [
    "PYTHON_TOOL",
    "TOOL_NAME",
    "CacheAwarePolicy",
    "ChatFormat",
    "Engine",
    "EngineConfig",
    "EngineProgress",
    "EngineStatus",
    "FinishReason",
    "ForecastPolicy",
    "Generation",
    "HFEngineConfig",
    "InvalidWeights",
    "Job",
    "JobResult",
    "KVAwarePolicy",
    "KVCapacity",
    "KVProgressPolicy",
    "LeastRequestsPolicy",
    "LeastTokensPolicy",
    "OpenAIEngineConfig",
    "ParsedTurn",
    "PowerOfTwoPolicy",
    "Problem",
    "ProgressEngine",
    "Rollout",
    "RolloutClient",
    "RolloutConfig",
    "RolloutError",
    "RolloutSampling",
    "RolloutWorker",
    "SamplingParams",
    "Scheduler",
    "SchedulerConfig",
    "SleepingEngine",
    "StaticPolicy",
    "Timings",
    "ToolCallRecord",
    "ToolCallRequest",
    "ToolOutcome",
    "Trajectory",
    "VLLMEngineConfig",
    "WeightSpec",
    "WeightUpdate",
    "WorkerConfig",
    "WorkerResult",
    "agent_producer",
    "build_engine",
    "encode_conversation",
    "format_tool_result",
    "parse_turn",
    "render_call",
    "run_agent",
    "start_server",
    "system_prompt",
    "wrap_question",
]
