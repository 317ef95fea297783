from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ErrorKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_KIND_UNSPECIFIED: _ClassVar[ErrorKind]
    ERROR_KIND_SYNTAX: _ClassVar[ErrorKind]
    ERROR_KIND_POLICY_VIOLATION: _ClassVar[ErrorKind]
    ERROR_KIND_RUNTIME: _ClassVar[ErrorKind]
    ERROR_KIND_TIMEOUT: _ClassVar[ErrorKind]
    ERROR_KIND_MEMORY_LIMIT: _ClassVar[ErrorKind]
    ERROR_KIND_OUTPUT_TOO_LARGE: _ClassVar[ErrorKind]
    ERROR_KIND_INTERNAL: _ClassVar[ErrorKind]
ERROR_KIND_UNSPECIFIED: ErrorKind
ERROR_KIND_SYNTAX: ErrorKind
ERROR_KIND_POLICY_VIOLATION: ErrorKind
ERROR_KIND_RUNTIME: ErrorKind
ERROR_KIND_TIMEOUT: ErrorKind
ERROR_KIND_MEMORY_LIMIT: ErrorKind
ERROR_KIND_OUTPUT_TOO_LARGE: ErrorKind
ERROR_KIND_INTERNAL: ErrorKind

class InlineCode(_message.Message):
    __slots__ = ("code", "filename")
    CODE_FIELD_NUMBER: _ClassVar[int]
    FILENAME_FIELD_NUMBER: _ClassVar[int]
    code: str
    filename: str
    def __init__(self, code: _Optional[str] = ..., filename: _Optional[str] = ...) -> None: ...

class ExecuteRequest(_message.Message):
    __slots__ = ("task_id", "runtime", "input_json", "timeout_seconds", "metadata", "inline_code")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    INLINE_CODE_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    runtime: str
    input_json: str
    timeout_seconds: int
    metadata: _containers.ScalarMap[str, str]
    inline_code: InlineCode
    def __init__(self, task_id: _Optional[str] = ..., runtime: _Optional[str] = ..., input_json: _Optional[str] = ..., timeout_seconds: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ..., inline_code: _Optional[_Union[InlineCode, _Mapping]] = ...) -> None: ...

class ExecutionError(_message.Message):
    __slots__ = ("kind", "message", "line", "traceback")
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LINE_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    kind: ErrorKind
    message: str
    line: int
    traceback: str
    def __init__(self, kind: _Optional[_Union[ErrorKind, str]] = ..., message: _Optional[str] = ..., line: _Optional[int] = ..., traceback: _Optional[str] = ...) -> None: ...

class ExecuteResponse(_message.Message):
    __slots__ = ("success", "output_json", "error", "logs", "logs_truncated", "duration_ms")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LOGS_FIELD_NUMBER: _ClassVar[int]
    LOGS_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    output_json: str
    error: ExecutionError
    logs: str
    logs_truncated: bool
    duration_ms: float
    def __init__(self, success: _Optional[bool] = ..., output_json: _Optional[str] = ..., error: _Optional[_Union[ExecutionError, _Mapping]] = ..., logs: _Optional[str] = ..., logs_truncated: _Optional[bool] = ..., duration_ms: _Optional[float] = ...) -> None: ...
