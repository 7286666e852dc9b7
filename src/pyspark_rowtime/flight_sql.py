"""The few Flight SQL messages ``rowtime serve`` reads and writes, decoded by hand.

There is no Flight SQL server library for Python (apache/arrow 37700, 40263), and ADBC's
Flight SQL driver needs only this of a server to ingest: a DoPut whose descriptor command is a
``google.protobuf.Any`` holding ``CommandStatementIngest`` (bulk ingest, ``adbc_ingest``) or
``CommandStatementUpdate`` (``execute_update``), answered by one ``DoPutUpdateResult``. The
protobuf wire format is a sequence of (field number, wire type) keys, each followed by a
varint, a length-delimited byte string, or a fixed 32/64-bit value
(https://protobuf.dev/programming-guides/encoding/); the fields below are those of Arrow's
``FlightSql.proto``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "CLOSE_PREPARED",
    "CREATE_PREPARED",
    "INGEST_TYPE",
    "PREPARED_UPDATE_TYPE",
    "UPDATE_TYPE",
    "SqlCommand",
    "encode_prepared_result",
    "encode_update_result",
    "parse_command",
    "parse_prepare_request",
]

_PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."
#: The ``Any`` type URL of a bulk ingest (``adbc_ingest``).
INGEST_TYPE = _PREFIX + "CommandStatementIngest"
#: The ``Any`` type URL of an update statement (``execute_update``).
UPDATE_TYPE = _PREFIX + "CommandStatementUpdate"
#: The ``Any`` type URL of a prepared statement's update (DB-API's ``execute``, JDBC's
#: ``executeUpdate``: the driver prepares first).
PREPARED_UPDATE_TYPE = _PREFIX + "CommandPreparedStatementUpdate"
#: The actions that prepare and close a statement, and the messages they carry.
CREATE_PREPARED = "CreatePreparedStatement"
CLOSE_PREPARED = "ClosePreparedStatement"
_CREATE_REQUEST = _PREFIX + "ActionCreatePreparedStatementRequest"
_CREATE_RESULT = _PREFIX + "ActionCreatePreparedStatementResult"

_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


class ProtobufError(ValueError):
    """Bytes that are not the protobuf message they should be."""


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ProtobufError("a varint runs past the end of the message")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise ProtobufError("a varint longer than 10 bytes")


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """``(field number, wire type, value)`` for each field of a message: an int for varints
    and fixed-width fields, the bytes for length-delimited ones (strings, messages)."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == _VARINT:
            value, at = _varint(data, at)
        elif wire == _LEN:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ProtobufError(f"field {number} runs past the end of the message")
            value, at = data[at : at + size], at + size
        elif wire in (_I64, _I32):
            width = 8 if wire == _I64 else 4
            value, at = int.from_bytes(data[at : at + width], "little"), at + width
        else:
            raise ProtobufError(f"field {number} has wire type {wire}, which proto3 never writes")
        yield number, wire, value


@dataclass(frozen=True)
class SqlCommand:
    """A Flight SQL command: its type URL, and what ``rowtime serve`` reads of it: the table
    of an ingest (``CommandStatementIngest.table``, field 2), the text of an update
    (``CommandStatementUpdate.query``, field 1)."""

    type_url: str
    table: str | None = None
    query: str | None = None


def _text(value: int | bytes, what: str) -> str:
    if not isinstance(value, bytes):
        raise ProtobufError(f"{what} is not a string")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ProtobufError(f"{what} is not UTF-8: {e}") from None


def _any(body: bytes, what: str) -> tuple[str | None, bytes]:
    """The type URL (field 1) and the message (field 2) of a ``google.protobuf.Any``."""
    type_url, inner = None, b""
    for number, _, value in fields(body):
        if number == 1:
            type_url = _text(value, f"{what}'s type URL")
        elif number == 2 and isinstance(value, bytes):
            inner = value
    return type_url, inner


def _string(message: bytes, number: int, what: str) -> str | None:
    """The string field ``number`` of a message (the last one given: protobuf's rule for a
    field that comes twice), None if absent."""
    found = None
    for n, _, value in fields(message):
        if n == number:
            found = _text(value, what)
    return found


def parse_command(command: bytes) -> SqlCommand:
    """The Flight SQL command in a descriptor's ``cmd`` bytes (a ``google.protobuf.Any``:
    field 1 the type URL, field 2 the message). Raises ``ProtobufError``."""
    type_url, body = _any(command, "the command")
    if type_url is None:
        raise ProtobufError("the descriptor's command is not a Flight SQL command (no type URL)")
    if type_url == INGEST_TYPE:
        return SqlCommand(type_url, table=_string(body, 2, "CommandStatementIngest.table"))
    if type_url == UPDATE_TYPE:
        return SqlCommand(type_url, query=_string(body, 1, "CommandStatementUpdate.query"))
    if type_url == PREPARED_UPDATE_TYPE:
        # The handle is the statement's text (encode_prepared_result): nothing to look up.
        handle = _string(body, 1, "CommandPreparedStatementUpdate.prepared_statement_handle")
        return SqlCommand(type_url, query=handle)
    return SqlCommand(type_url)


def parse_prepare_request(body: bytes) -> str:
    """The query of a ``CreatePreparedStatement`` action's body (an ``Any`` holding
    ``ActionCreatePreparedStatementRequest``: field 1 the query)."""
    type_url, inner = _any(body, "the action's body")
    if type_url != _CREATE_REQUEST:
        raise ProtobufError(f"the action's body is {type_url!r}, not {_CREATE_REQUEST}")
    query = _string(inner, 1, "ActionCreatePreparedStatementRequest.query")
    if query is None:
        raise ProtobufError("ActionCreatePreparedStatementRequest has no query")
    return query


def _length_delimited(number: int, value: bytes) -> bytes:
    return _encode_varint(number << 3 | _LEN) + _encode_varint(len(value)) + value


def encode_prepared_result(query: str) -> bytes:
    """The result of ``CreatePreparedStatement`` (an ``Any`` holding
    ``ActionCreatePreparedStatementResult``): its handle (field 1) is the query's text, so a
    statement needs no server state and survives a server restart; no schemas (an update
    returns no rows and takes no parameters)."""
    result = _length_delimited(1, query.encode("utf-8"))
    return _length_delimited(1, _CREATE_RESULT.encode()) + _length_delimited(2, result)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # int64 as protobuf writes it: two's complement, 10 bytes if < 0
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_update_result(record_count: int) -> bytes:
    """A ``DoPutUpdateResult`` (field 1, ``int64 record_count``): the one reply the ADBC
    driver reads after an ingest or an update."""
    return b"\x08" + _encode_varint(record_count)
