import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_RUNNING: _ClassVar[RunState]
    RUN_STATE_COMPLETED: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]
    RUN_STATE_CANCELLED: _ClassVar[RunState]

class TaskState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATE_UNSPECIFIED: _ClassVar[TaskState]
    TASK_STATE_PENDING: _ClassVar[TaskState]
    TASK_STATE_QUEUED: _ClassVar[TaskState]
    TASK_STATE_RUNNING: _ClassVar[TaskState]
    TASK_STATE_COMPLETED: _ClassVar[TaskState]
    TASK_STATE_FAILED: _ClassVar[TaskState]
    TASK_STATE_SKIPPED: _ClassVar[TaskState]
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_COMPLETED: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_CANCELLED: RunState
TASK_STATE_UNSPECIFIED: TaskState
TASK_STATE_PENDING: TaskState
TASK_STATE_QUEUED: TaskState
TASK_STATE_RUNNING: TaskState
TASK_STATE_COMPLETED: TaskState
TASK_STATE_FAILED: TaskState
TASK_STATE_SKIPPED: TaskState

class AcquireTaskLeaseRequest(_message.Message):
    __slots__ = ("task_id", "run_id", "owner", "ttl_seconds", "attempt")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    run_id: str
    owner: str
    ttl_seconds: int
    attempt: int
    def __init__(self, task_id: _Optional[str] = ..., run_id: _Optional[str] = ..., owner: _Optional[str] = ..., ttl_seconds: _Optional[int] = ..., attempt: _Optional[int] = ...) -> None: ...

class AcquireTaskLeaseResponse(_message.Message):
    __slots__ = ("acquired",)
    ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    acquired: bool
    def __init__(self, acquired: _Optional[bool] = ...) -> None: ...

class ReleaseTaskLeaseRequest(_message.Message):
    __slots__ = ("task_id", "run_id", "owner", "attempt", "reason")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    run_id: str
    owner: str
    attempt: int
    reason: str
    def __init__(self, task_id: _Optional[str] = ..., run_id: _Optional[str] = ..., owner: _Optional[str] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleaseTaskLeaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class ReportTaskResultRequest(_message.Message):
    __slots__ = ("task_id", "run_id", "node_id", "attempt", "owner", "status", "output", "error", "dead_letter", "delivery_count")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DEAD_LETTER_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    run_id: str
    node_id: str
    attempt: int
    owner: str
    status: str
    output: bytes
    error: str
    dead_letter: bool
    delivery_count: int
    def __init__(self, task_id: _Optional[str] = ..., run_id: _Optional[str] = ..., node_id: _Optional[str] = ..., attempt: _Optional[int] = ..., owner: _Optional[str] = ..., status: _Optional[str] = ..., output: _Optional[bytes] = ..., error: _Optional[str] = ..., dead_letter: _Optional[bool] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class ReportTaskResultResponse(_message.Message):
    __slots__ = ("acknowledged", "applied", "ignored_reason")
    ACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    IGNORED_REASON_FIELD_NUMBER: _ClassVar[int]
    acknowledged: bool
    applied: bool
    ignored_reason: str
    def __init__(self, acknowledged: _Optional[bool] = ..., applied: _Optional[bool] = ..., ignored_reason: _Optional[str] = ...) -> None: ...

class RegisterWorkflowRequest(_message.Message):
    __slots__ = ("definition",)
    DEFINITION_FIELD_NUMBER: _ClassVar[int]
    definition: bytes
    def __init__(self, definition: _Optional[bytes] = ...) -> None: ...

class RegisterWorkflowResponse(_message.Message):
    __slots__ = ("name", "version", "created")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: int
    created: bool
    def __init__(self, name: _Optional[str] = ..., version: _Optional[int] = ..., created: _Optional[bool] = ...) -> None: ...

class StartRunRequest(_message.Message):
    __slots__ = ("workflow", "version", "input", "idempotency_key")
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    workflow: str
    version: int
    input: bytes
    idempotency_key: str
    def __init__(self, workflow: _Optional[str] = ..., version: _Optional[int] = ..., input: _Optional[bytes] = ..., idempotency_key: _Optional[str] = ...) -> None: ...

class StartRunResponse(_message.Message):
    __slots__ = ("run_id", "created", "version")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    created: bool
    version: int
    def __init__(self, run_id: _Optional[str] = ..., created: _Optional[bool] = ..., version: _Optional[int] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class TaskInstance(_message.Message):
    __slots__ = ("id", "node_id", "node_type", "queue", "state", "attempt", "max_attempts", "input", "output", "error", "lease_owner", "lease_expires_at", "next_attempt_at", "started_at", "finished_at", "updated_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_TYPE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEASE_OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    node_id: str
    node_type: str
    queue: str
    state: TaskState
    attempt: int
    max_attempts: int
    input: bytes
    output: bytes
    error: str
    lease_owner: str
    lease_expires_at: _timestamp_pb2.Timestamp
    next_attempt_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., node_id: _Optional[str] = ..., node_type: _Optional[str] = ..., queue: _Optional[str] = ..., state: _Optional[_Union[TaskState, str]] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., input: _Optional[bytes] = ..., output: _Optional[bytes] = ..., error: _Optional[str] = ..., lease_owner: _Optional[str] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., next_attempt_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class IgnoredReport(_message.Message):
    __slots__ = ("task_id", "attempt", "owner", "status", "reason", "at")
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    task_id: str
    attempt: int
    owner: str
    status: str
    reason: str
    at: _timestamp_pb2.Timestamp
    def __init__(self, task_id: _Optional[str] = ..., attempt: _Optional[int] = ..., owner: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("id", "workflow", "version", "state", "input", "output", "error", "created_at", "updated_at", "tasks")
    ID_FIELD_NUMBER: _ClassVar[int]
    WORKFLOW_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    INPUT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    id: str
    workflow: str
    version: int
    state: RunState
    input: bytes
    output: bytes
    error: str
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInstance]
    def __init__(self, id: _Optional[str] = ..., workflow: _Optional[str] = ..., version: _Optional[int] = ..., state: _Optional[_Union[RunState, str]] = ..., input: _Optional[bytes] = ..., output: _Optional[bytes] = ..., error: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tasks: _Optional[_Iterable[_Union[TaskInstance, _Mapping]]] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run", "ignored_reports")
    RUN_FIELD_NUMBER: _ClassVar[int]
    IGNORED_REPORTS_FIELD_NUMBER: _ClassVar[int]
    run: Run
    ignored_reports: _containers.RepeatedCompositeFieldContainer[IgnoredReport]
    def __init__(self, run: _Optional[_Union[Run, _Mapping]] = ..., ignored_reports: _Optional[_Iterable[_Union[IgnoredReport, _Mapping]]] = ...) -> None: ...

class WatchRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class RunEvent(_message.Message):
    __slots__ = ("run_id", "run_state", "task", "run")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_STATE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    run_state: RunState
    task: TaskInstance
    run: Run
    def __init__(self, run_id: _Optional[str] = ..., run_state: _Optional[_Union[RunState, str]] = ..., task: _Optional[_Union[TaskInstance, _Mapping]] = ..., run: _Optional[_Union[Run, _Mapping]] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("cancelled", "state")
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    state: RunState
    def __init__(self, cancelled: _Optional[bool] = ..., state: _Optional[_Union[RunState, str]] = ...) -> None: ...

class ListDeadLettersRequest(_message.Message):
    __slots__ = ("run_id", "limit")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    limit: int
    def __init__(self, run_id: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("run_id", "task_id", "node_id", "attempt", "delivery_count", "reported_by", "reason", "at")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    REPORTED_BY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    task_id: str
    node_id: str
    attempt: int
    delivery_count: int
    reported_by: str
    reason: str
    at: _timestamp_pb2.Timestamp
    def __init__(self, run_id: _Optional[str] = ..., task_id: _Optional[str] = ..., node_id: _Optional[str] = ..., attempt: _Optional[int] = ..., delivery_count: _Optional[int] = ..., reported_by: _Optional[str] = ..., reason: _Optional[str] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class ListDeadLettersResponse(_message.Message):
    __slots__ = ("dead_letters",)
    DEAD_LETTERS_FIELD_NUMBER: _ClassVar[int]
    dead_letters: _containers.RepeatedCompositeFieldContainer[DeadLetter]
    def __init__(self, dead_letters: _Optional[_Iterable[_Union[DeadLetter, _Mapping]]] = ...) -> None: ...
