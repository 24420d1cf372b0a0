from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_OUTCOME_UNSPECIFIED: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_OK: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_ERROR: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_TIMEOUT: _ClassVar[ToolOutcome]
    TOOL_OUTCOME_PARSE_ERROR: _ClassVar[ToolOutcome]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_ANSWERED: _ClassVar[FinishReason]
    FINISH_REASON_NO_TOOL_CALL: _ClassVar[FinishReason]
    FINISH_REASON_MAX_TURNS: _ClassVar[FinishReason]
    FINISH_REASON_MAX_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
TOOL_OUTCOME_UNSPECIFIED: ToolOutcome
TOOL_OUTCOME_OK: ToolOutcome
TOOL_OUTCOME_ERROR: ToolOutcome
TOOL_OUTCOME_TIMEOUT: ToolOutcome
TOOL_OUTCOME_PARSE_ERROR: ToolOutcome
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_ANSWERED: FinishReason
FINISH_REASON_NO_TOOL_CALL: FinishReason
FINISH_REASON_MAX_TURNS: FinishReason
FINISH_REASON_MAX_LENGTH: FinishReason
FINISH_REASON_ERROR: FinishReason

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "max_response_tokens", "max_turns", "seed", "n", "count_tool_tokens", "max_tokens_per_turn", "max_context_tokens", "max_tool_calls_per_turn", "max_tool_response_chars", "tool_timeout_s", "system_prompt")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MAX_RESPONSE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TURNS_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    COUNT_TOOL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_TURN_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_CALLS_PER_TURN_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_RESPONSE_CHARS_FIELD_NUMBER: _ClassVar[int]
    TOOL_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_PROMPT_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    max_response_tokens: int
    max_turns: int
    seed: int
    n: int
    count_tool_tokens: bool
    max_tokens_per_turn: int
    max_context_tokens: int
    max_tool_calls_per_turn: int
    max_tool_response_chars: int
    tool_timeout_s: float
    system_prompt: str
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., max_response_tokens: _Optional[int] = ..., max_turns: _Optional[int] = ..., seed: _Optional[int] = ..., n: _Optional[int] = ..., count_tool_tokens: _Optional[bool] = ..., max_tokens_per_turn: _Optional[int] = ..., max_context_tokens: _Optional[int] = ..., max_tool_calls_per_turn: _Optional[int] = ..., max_tool_response_chars: _Optional[int] = ..., tool_timeout_s: _Optional[float] = ..., system_prompt: _Optional[str] = ...) -> None: ...

class Problem(_message.Message):
    __slots__ = ("id", "question", "answer")
    ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    id: str
    question: str
    answer: str
    def __init__(self, id: _Optional[str] = ..., question: _Optional[str] = ..., answer: _Optional[str] = ...) -> None: ...

class RolloutRequest(_message.Message):
    __slots__ = ("problems", "sampling", "request_id")
    PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    problems: _containers.RepeatedCompositeFieldContainer[Problem]
    sampling: SamplingParams
    request_id: str
    def __init__(self, problems: _Optional[_Iterable[_Union[Problem, _Mapping]]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("turn", "code", "outcome", "latency_s", "name", "stdin", "message", "response")
    TURN_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    LATENCY_S_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    turn: int
    code: str
    outcome: ToolOutcome
    latency_s: float
    name: str
    stdin: str
    message: str
    response: str
    def __init__(self, turn: _Optional[int] = ..., code: _Optional[str] = ..., outcome: _Optional[_Union[ToolOutcome, str]] = ..., latency_s: _Optional[float] = ..., name: _Optional[str] = ..., stdin: _Optional[str] = ..., message: _Optional[str] = ..., response: _Optional[str] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("problem_id", "sample_index", "prompt_ids", "response_ids", "loss_mask", "logprobs", "turns", "tool_calls", "final_answer", "finish_reason", "answer_blocks", "generate_s", "tool_s", "error", "engine", "queued_s", "versions")
    PROBLEM_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_IDS_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    FINAL_ANSWER_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    ANSWER_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    GENERATE_S_FIELD_NUMBER: _ClassVar[int]
    TOOL_S_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_S_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    problem_id: str
    sample_index: int
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    response_ids: _containers.RepeatedScalarFieldContainer[int]
    loss_mask: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    turns: int
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    final_answer: str
    finish_reason: FinishReason
    answer_blocks: int
    generate_s: float
    tool_s: float
    error: str
    engine: str
    queued_s: float
    versions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, problem_id: _Optional[str] = ..., sample_index: _Optional[int] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., response_ids: _Optional[_Iterable[int]] = ..., loss_mask: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., turns: _Optional[int] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., final_answer: _Optional[str] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., answer_blocks: _Optional[int] = ..., generate_s: _Optional[float] = ..., tool_s: _Optional[float] = ..., error: _Optional[str] = ..., engine: _Optional[str] = ..., queued_s: _Optional[float] = ..., versions: _Optional[_Iterable[int]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineInfo(_message.Message):
    __slots__ = ("name", "free_kv_tokens", "total_kv_tokens", "running", "healthy", "reserved_kv_tokens", "dead_reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FREE_KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    RESERVED_KV_TOKENS_FIELD_NUMBER: _ClassVar[int]
    DEAD_REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    free_kv_tokens: int
    total_kv_tokens: int
    running: int
    healthy: bool
    reserved_kv_tokens: int
    dead_reason: str
    def __init__(self, name: _Optional[str] = ..., free_kv_tokens: _Optional[int] = ..., total_kv_tokens: _Optional[int] = ..., running: _Optional[int] = ..., healthy: _Optional[bool] = ..., reserved_kv_tokens: _Optional[int] = ..., dead_reason: _Optional[str] = ...) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("version", "engines", "policy")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    version: str
    engines: _containers.RepeatedCompositeFieldContainer[EngineInfo]
    policy: str
    def __init__(self, version: _Optional[str] = ..., engines: _Optional[_Iterable[_Union[EngineInfo, _Mapping]]] = ..., policy: _Optional[str] = ...) -> None: ...

class WeightChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class UpdateWeightsResponse(_message.Message):
    __slots__ = ("tensors", "bytes", "receive_s", "load_s", "engines")
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    RECEIVE_S_FIELD_NUMBER: _ClassVar[int]
    LOAD_S_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    tensors: int
    bytes: int
    receive_s: float
    load_s: float
    engines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tensors: _Optional[int] = ..., bytes: _Optional[int] = ..., receive_s: _Optional[float] = ..., load_s: _Optional[float] = ..., engines: _Optional[_Iterable[str]] = ...) -> None: ...
