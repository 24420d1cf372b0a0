from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STATUS_UNSPECIFIED: _ClassVar[Status]
    STATUS_OK: _ClassVar[Status]
    STATUS_ERROR: _ClassVar[Status]
    STATUS_TIMEOUT: _ClassVar[Status]
    STATUS_MEMORY_EXCEEDED: _ClassVar[Status]
    STATUS_OUTPUT_TRUNCATED: _ClassVar[Status]
    STATUS_REJECTED: _ClassVar[Status]
    STATUS_SANDBOX_ERROR: _ClassVar[Status]
STATUS_UNSPECIFIED: Status
STATUS_OK: Status
STATUS_ERROR: Status
STATUS_TIMEOUT: Status
STATUS_MEMORY_EXCEEDED: Status
STATUS_OUTPUT_TRUNCATED: Status
STATUS_REJECTED: Status
STATUS_SANDBOX_ERROR: Status

class ExecuteRequest(_message.Message):
    __slots__ = ("code", "stdin", "timeout_s", "session_id", "request_id", "memory_bytes", "max_output_bytes")
    CODE_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    code: str
    stdin: str
    timeout_s: float
    session_id: str
    request_id: str
    memory_bytes: int
    max_output_bytes: int
    def __init__(self, code: _Optional[str] = ..., stdin: _Optional[str] = ..., timeout_s: _Optional[float] = ..., session_id: _Optional[str] = ..., request_id: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., max_output_bytes: _Optional[int] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("status", "stdout", "stderr", "traceback", "result_repr", "exit_code", "wall_s", "cpu_s", "request_id", "message", "queue_s")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    STDOUT_FIELD_NUMBER: _ClassVar[int]
    STDERR_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    RESULT_REPR_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    WALL_S_FIELD_NUMBER: _ClassVar[int]
    CPU_S_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_S_FIELD_NUMBER: _ClassVar[int]
    status: Status
    stdout: str
    stderr: str
    traceback: str
    result_repr: str
    exit_code: int
    wall_s: float
    cpu_s: float
    request_id: str
    message: str
    queue_s: float
    def __init__(self, status: _Optional[_Union[Status, str]] = ..., stdout: _Optional[str] = ..., stderr: _Optional[str] = ..., traceback: _Optional[str] = ..., result_repr: _Optional[str] = ..., exit_code: _Optional[int] = ..., wall_s: _Optional[float] = ..., cpu_s: _Optional[float] = ..., request_id: _Optional[str] = ..., message: _Optional[str] = ..., queue_s: _Optional[float] = ...) -> None: ...

class ExecuteBatchRequest(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[ExecuteRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[ExecuteRequest, _Mapping]]] = ...) -> None: ...

class ExecuteBatchResponse(_message.Message):
    __slots__ = ("responses",)
    RESPONSES_FIELD_NUMBER: _ClassVar[int]
    responses: _containers.RepeatedCompositeFieldContainer[ExecuteResponse]
    def __init__(self, responses: _Optional[_Iterable[_Union[ExecuteResponse, _Mapping]]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Limits(_message.Message):
    __slots__ = ("default_timeout_s", "max_timeout_s", "memory_bytes", "max_output_bytes", "max_code_bytes", "max_queue", "max_sessions", "session_cpu_s")
    DEFAULT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_OUTPUT_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CODE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    SESSION_CPU_S_FIELD_NUMBER: _ClassVar[int]
    default_timeout_s: float
    max_timeout_s: float
    memory_bytes: int
    max_output_bytes: int
    max_code_bytes: int
    max_queue: int
    max_sessions: int
    session_cpu_s: float
    def __init__(self, default_timeout_s: _Optional[float] = ..., max_timeout_s: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., max_output_bytes: _Optional[int] = ..., max_code_bytes: _Optional[int] = ..., max_queue: _Optional[int] = ..., max_sessions: _Optional[int] = ..., session_cpu_s: _Optional[float] = ...) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("version", "workers", "confinements", "unavailable", "limits", "in_flight", "queued", "preloaded", "sessions", "warning")
    class UnavailableEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    CONFINEMENTS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    PRELOADED_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    version: str
    workers: int
    confinements: _containers.RepeatedScalarFieldContainer[str]
    unavailable: _containers.ScalarMap[str, str]
    limits: Limits
    in_flight: int
    queued: int
    preloaded: _containers.RepeatedScalarFieldContainer[str]
    sessions: int
    warning: str
    def __init__(self, version: _Optional[str] = ..., workers: _Optional[int] = ..., confinements: _Optional[_Iterable[str]] = ..., unavailable: _Optional[_Mapping[str, str]] = ..., limits: _Optional[_Union[Limits, _Mapping]] = ..., in_flight: _Optional[int] = ..., queued: _Optional[int] = ..., preloaded: _Optional[_Iterable[str]] = ..., sessions: _Optional[int] = ..., warning: _Optional[str] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("closed",)
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    closed: bool
    def __init__(self, closed: _Optional[bool] = ...) -> None: ...
