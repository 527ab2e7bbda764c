from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
PRIORITY_BACKGROUND: Priority
PRIORITY_INTERACTIVE: Priority
PRIORITY_UNSPECIFIED: Priority
ROLE_FOLLOWER: Role
ROLE_HIT: Role
ROLE_LEADER: Role
ROLE_UNSPECIFIED: Role
SOURCE_L1: Source
SOURCE_L2: Source
SOURCE_UNSPECIFIED: Source
SOURCE_UPSTREAM: Source
STAGE_BREAKER_OPEN: Stage
STAGE_DEGRADED: Stage
STAGE_FETCHING: Stage
STAGE_JOINED: Stage
STAGE_RATE_LIMITED: Stage
STAGE_RETRYING: Stage
STAGE_SERVING_STALE: Stage
STAGE_UNSPECIFIED: Stage
STAGE_WAITING_LEADER: Stage

class Chunk(_message.Message):
    __slots__ = ["data"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class GetOrFetchRequest(_message.Message):
    __slots__ = ["credential", "head", "headers", "key", "max_age", "no_stale", "priority", "url"]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_FIELD_NUMBER: _ClassVar[int]
    NO_STALE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    credential: str
    head: bool
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    key: str
    max_age: _duration_pb2.Duration
    no_stale: bool
    priority: Priority
    url: str
    def __init__(self, url: _Optional[str] = ..., key: _Optional[str] = ..., no_stale: bool = ..., max_age: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., credential: _Optional[str] = ..., head: bool = ..., priority: _Optional[_Union[Priority, str]] = ...) -> None: ...

class GetOrFetchResponse(_message.Message):
    __slots__ = ["chunk", "metadata", "progress"]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    chunk: Chunk
    metadata: Metadata
    progress: Progress
    def __init__(self, progress: _Optional[_Union[Progress, _Mapping]] = ..., metadata: _Optional[_Union[Metadata, _Mapping]] = ..., chunk: _Optional[_Union[Chunk, _Mapping]] = ...) -> None: ...

class Header(_message.Message):
    __slots__ = ["name", "value"]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class InvalidateRequest(_message.Message):
    __slots__ = ["credential", "headers", "key", "url"]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    credential: str
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    key: str
    url: str
    def __init__(self, url: _Optional[str] = ..., key: _Optional[str] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., credential: _Optional[str] = ...) -> None: ...

class InvalidateResponse(_message.Message):
    __slots__ = ["existed", "key"]
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    existed: bool
    key: str
    def __init__(self, key: _Optional[str] = ..., existed: bool = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ["age", "cache_control", "content_type", "etag", "headers", "key", "last_modified", "private", "size", "source", "stale", "status_code", "ttl", "upstream"]
    AGE_FIELD_NUMBER: _ClassVar[int]
    CACHE_CONTROL_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    ETAG_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    LAST_MODIFIED_FIELD_NUMBER: _ClassVar[int]
    PRIVATE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    STATUS_CODE_FIELD_NUMBER: _ClassVar[int]
    TTL_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_FIELD_NUMBER: _ClassVar[int]
    age: _duration_pb2.Duration
    cache_control: str
    content_type: str
    etag: str
    headers: _containers.RepeatedCompositeFieldContainer[Header]
    key: str
    last_modified: str
    private: bool
    size: int
    source: Source
    stale: bool
    status_code: int
    ttl: _duration_pb2.Duration
    upstream: str
    def __init__(self, source: _Optional[_Union[Source, str]] = ..., stale: bool = ..., status_code: _Optional[int] = ..., content_type: _Optional[str] = ..., age: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., size: _Optional[int] = ..., key: _Optional[str] = ..., upstream: _Optional[str] = ..., etag: _Optional[str] = ..., last_modified: _Optional[str] = ..., ttl: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ..., headers: _Optional[_Iterable[_Union[Header, _Mapping]]] = ..., private: bool = ..., cache_control: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ["attempt", "detail", "role", "stage", "wait"]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    detail: str
    role: Role
    stage: Stage
    wait: _duration_pb2.Duration
    def __init__(self, role: _Optional[_Union[Role, str]] = ..., stage: _Optional[_Union[Stage, str]] = ..., detail: _Optional[str] = ..., attempt: _Optional[int] = ..., wait: _Optional[_Union[_duration_pb2.Duration, _Mapping]] = ...) -> None: ...

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Role(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Stage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class Source(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
