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
    "INGEST_TYPE",
    "UPDATE_TYPE",
    "SqlCommand",
    "encode_update_result",
    "parse_command",
]

_PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."
#: The ``Any`` type URL of a bulk ingest (``adbc_ingest``).
INGEST_TYPE = _PREFIX + "CommandStatementIngest"
#: The ``Any`` type URL of an update statement (``execute_update``).
UPDATE_TYPE = _PREFIX + "CommandStatementUpdate"

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


def parse_command(command: bytes) -> SqlCommand:
    """The Flight SQL command in a descriptor's ``cmd`` bytes (a ``google.protobuf.Any``:
    field 1 the type URL, field 2 the message). Raises :class:`ProtobufError`."""
    type_url, body = None, b""
    for number, _, value in fields(command):
        if number == 1:
            type_url = _text(value, "the command's type URL")
        elif number == 2 and isinstance(value, bytes):
            body = value
    if type_url is None:
        raise ProtobufError("the descriptor's command is not a Flight SQL command (no type URL)")
    if type_url == INGEST_TYPE:
        table = None
        for number, _, value in fields(body):
            if number == 2:
                table = _text(value, "CommandStatementIngest.table")
        return SqlCommand(type_url, table=table)
    if type_url == UPDATE_TYPE:
        query = None
        for number, _, value in fields(body):
            if number == 1:
                query = _text(value, "CommandStatementUpdate.query")
        return SqlCommand(type_url, query=query)
    return SqlCommand(type_url)


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
