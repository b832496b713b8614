from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class TelemetryBatch(_message.Message):
    __slots__ = ("schema_version", "source", "seq", "rows", "dict", "ts_ns", "device_idx", "port_idx", "qual_idx", "metric_idx", "value", "raw", "raw_valid", "produced_ns")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    DICT_FIELD_NUMBER: _ClassVar[int]
    TS_NS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_IDX_FIELD_NUMBER: _ClassVar[int]
    PORT_IDX_FIELD_NUMBER: _ClassVar[int]
    QUAL_IDX_FIELD_NUMBER: _ClassVar[int]
    METRIC_IDX_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    RAW_VALID_FIELD_NUMBER: _ClassVar[int]
    PRODUCED_NS_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    source: str
    seq: int
    rows: int
    dict: _containers.RepeatedScalarFieldContainer[str]
    ts_ns: bytes
    device_idx: bytes
    port_idx: bytes
    qual_idx: bytes
    metric_idx: bytes
    value: bytes
    raw: bytes
    raw_valid: bytes
    produced_ns: int
    def __init__(self, schema_version: _Optional[int] = ..., source: _Optional[str] = ..., seq: _Optional[int] = ..., rows: _Optional[int] = ..., dict: _Optional[_Iterable[str]] = ..., ts_ns: _Optional[bytes] = ..., device_idx: _Optional[bytes] = ..., port_idx: _Optional[bytes] = ..., qual_idx: _Optional[bytes] = ..., metric_idx: _Optional[bytes] = ..., value: _Optional[bytes] = ..., raw: _Optional[bytes] = ..., raw_valid: _Optional[bytes] = ..., produced_ns: _Optional[int] = ...) -> None: ...
