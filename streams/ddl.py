"""Spark DDL strings to pyarrow schemas and back, without a JVM.

The log stores its payload schema as Arrow, and the Spark reader emits batches that must match
``pyspark.sql.pandas.types.to_arrow_schema(schema, timezone="UTC")`` exactly. Spark's own DDL
parser lives in the JVM, which the log (and the ``rowtime`` command) must not need, so this is a
small recursive-descent parser for the part of Spark's grammar that a table schema uses::

    schema := column ("," column)*
    column := name [":"] type ["NOT" "NULL"] ["COMMENT" 'text']
    type   := primitive | DECIMAL[(p[, s])] | VARCHAR(n) | CHAR(n)
            | ARRAY<type> | MAP<type, type> | STRUCT<[column ("," column)*]>
            | INTERVAL DAY|HOUR|MINUTE|SECOND [TO HOUR|MINUTE|SECOND] | TIME[(p)]

Keywords are case-insensitive; names may be backquoted (```` `` ```` escapes a backquote).
The mapping is Spark's: ``TIMESTAMP`` is ``timestamp('us', tz='UTC')``, ``TIMESTAMP_NTZ`` is
``timestamp('us')``, ``DECIMAL(p, s)`` is ``decimal128(p, s)``, arrays hold a nullable field
named ``element``, maps a non-null ``key`` and a nullable ``value``. A ``COMMENT`` goes into the
field metadata the way Spark puts it there.

``to_ddl`` renders a schema back (the readable form kept in a stream's metadata) and is
also the check that a pyarrow schema holds only types Spark can represent;
``normalize_schema`` maps a user's pyarrow schema onto Spark's Arrow form.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pyarrow as pa

from ..bounds.errors import SchemaError

__all__ = ["normalize_schema", "parse_ddl", "parse_type", "to_ddl", "type_to_ddl"]

#: The field metadata key pyspark uses for a StructField's metadata (its comment, ...).
SPARK_METADATA_KEY = b"SPARK::metadata::json"  # pyspark.sql.pandas.types.metadata_key

_PRIMITIVES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "tinyint": pa.int8(),
    "byte": pa.int8(),
    "smallint": pa.int16(),
    "short": pa.int16(),
    "int": pa.int32(),
    "integer": pa.int32(),
    "bigint": pa.int64(),
    "long": pa.int64(),
    "float": pa.float32(),
    "real": pa.float32(),
    "double": pa.float64(),
    "string": pa.string(),
    "binary": pa.binary(),
    "date": pa.date32(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "timestamp_ltz": pa.timestamp("us", tz="UTC"),
    "timestamp_ntz": pa.timestamp("us"),
}
_INTERVAL_FIELDS = ("day", "hour", "minute", "second")
_EXAMPLE = "write columns as `name TYPE`, e.g. 'a INT, b STRING, ts TIMESTAMP'"

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<quoted>`(?:[^`]|``)*`)
  | (?P<string>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<number>\d+(?![A-Za-z_]))
  | (?P<word>[A-Za-z0-9_]+)
  | (?P<punct>[<>(),:])
    """,
    re.VERBOSE,
)


@dataclass(frozen=True)
class _Tok:
    kind: str  # "word", "quoted", "string", "number", "punct", "end"
    text: str
    pos: int


def _tokenize(ddl: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    while pos < len(ddl):
        m = _TOKEN.match(ddl, pos)
        if m is None:
            raise _error(ddl, pos, f"unexpected character {ddl[pos]!r}")
        kind = m.lastgroup or ""
        if kind != "ws":
            toks.append(_Tok(kind, m.group(), pos))
        pos = m.end()
    toks.append(_Tok("end", "", len(ddl)))
    return toks


def _error(ddl: str, pos: int, what: str) -> SchemaError:
    snippet = ddl[max(0, pos - 20) : pos] + " >>> " + ddl[pos : pos + 20]
    return SchemaError(
        f"bad schema DDL at position {pos} ({snippet.strip()!r}): {what}; {_EXAMPLE}"
    )


class _Parser:
    def __init__(self, ddl: str) -> None:
        self.ddl = ddl
        self.toks = _tokenize(ddl)
        self.i = 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def fail(self, what: str, tok: _Tok | None = None) -> SchemaError:
        """An error at ``tok`` (default: the current token) saying what was expected there."""
        tok = tok or self.tok
        found = "the end of the text" if tok.kind == "end" else repr(tok.text)
        return _error(self.ddl, tok.pos, f"{what}, found {found}")

    def invalid(self, what: str, tok: _Tok) -> SchemaError:
        """An error about something well-formed but not allowed, starting at ``tok``."""
        return _error(self.ddl, tok.pos, what)

    def is_word(self, *words: str) -> bool:
        return self.tok.kind == "word" and self.tok.text.lower() in words

    def is_punct(self, p: str) -> bool:
        return self.tok.kind == "punct" and self.tok.text == p

    def expect_punct(self, p: str, what: str) -> None:
        if not self.is_punct(p):
            raise self.fail(f"expected {p!r} {what}")
        self.i += 1

    def expect_word(self, word: str) -> None:
        if not self.is_word(word):
            raise self.fail(f"expected {word.upper()}")
        self.i += 1

    def number(self, what: str) -> int:
        if self.tok.kind != "number":
            raise self.fail(f"expected {what} (a whole number)")
        value = int(self.tok.text)
        self.i += 1
        return value

    def name(self) -> str:
        tok = self.tok
        if tok.kind == "quoted":
            self.i += 1
            return tok.text[1:-1].replace("``", "`")
        if tok.kind in ("word", "number"):
            self.i += 1
            return tok.text
        raise self.fail("expected a column name")

    def columns(self, closing: str | None) -> list[pa.Field]:
        """``column ("," column)*`` up to ``closing`` (a punct) or the end of the text."""
        fields: list[pa.Field] = []
        seen: dict[str, int] = {}
        if closing is not None and self.is_punct(closing):
            return fields  # STRUCT<> is a valid, empty struct
        while True:
            start = self.tok
            field = self.column()
            key = field.name.lower()  # Spark resolves names case-insensitively by default
            if key in seen:
                raise self.invalid(
                    f"duplicate column name {field.name!r} (names are case-insensitive)", start
                )
            seen[key] = start.pos
            fields.append(field)
            if self.is_punct(","):
                self.i += 1
                continue
            if closing is None and self.tok.kind == "end":
                return fields
            if closing is not None and self.is_punct(closing):
                return fields
            what = "',' or '>'" if closing else "',' between columns"
            raise self.fail(f"expected {what}")

    def column(self) -> pa.Field:
        name = self.name()
        if self.is_punct(":"):
            self.i += 1
        dtype = self.type()
        nullable = True
        metadata = None
        if self.is_word("not"):
            self.i += 1
            self.expect_word("null")
            nullable = False
        if self.is_word("comment"):
            self.i += 1
            if self.tok.kind != "string":
                raise self.fail("expected a quoted comment after COMMENT")
            comment = _unquote(self.tok.text)
            self.i += 1
            metadata = {SPARK_METADATA_KEY: json.dumps({"comment": comment}).encode("utf-8")}
        return pa.field(name, dtype, nullable=nullable, metadata=metadata)

    def type(self) -> pa.DataType:
        tok = self.tok
        if tok.kind != "word":
            raise self.fail("expected a type name such as INT, STRING or TIMESTAMP")
        word = tok.text.lower()
        self.i += 1
        if word in _PRIMITIVES:
            return _PRIMITIVES[word]
        if word in ("decimal", "dec", "numeric"):
            return self.decimal(tok)
        if word in ("varchar", "char", "character"):
            self.expect_punct("(", f"after {tok.text.upper()}")
            self.number("a length")
            self.expect_punct(")", "after the length")
            return pa.string()  # Spark reads CHAR/VARCHAR columns as STRING
        if word == "time":
            if self.is_punct("("):
                self.i += 1
                precision = self.number("a precision")
                if not 0 <= precision <= 6:
                    raise self.invalid("TIME precision must be between 0 and 6", tok)
                self.expect_punct(")", "after the precision")
            return pa.time64("ns")
        if word == "interval":
            return self.interval()
        if word == "array":
            self.expect_punct("<", "after ARRAY")
            element = self.type()
            self.expect_punct(">", "to close ARRAY<...>")
            return pa.list_(pa.field("element", element, nullable=True))
        if word == "map":
            self.expect_punct("<", "after MAP")
            key = self.type()
            self.expect_punct(",", "between the key and value types of MAP<...>")
            value = self.type()
            self.expect_punct(">", "to close MAP<...>")
            return pa.map_(
                pa.field("key", key, nullable=False), pa.field("value", value, nullable=True)
            )
        if word == "struct":
            self.expect_punct("<", "after STRUCT")
            fields = self.columns(">")
            self.expect_punct(">", "to close STRUCT<...>")
            return pa.struct(fields)
        raise self.fail(
            "expected a type name (BOOLEAN, TINYINT, SMALLINT, INT, BIGINT, FLOAT, DOUBLE, "
            "DECIMAL(p,s), STRING, BINARY, DATE, TIMESTAMP, TIMESTAMP_NTZ, ARRAY<..>, MAP<..>, "
            "STRUCT<..>)",
            tok,
        )

    def decimal(self, tok: _Tok) -> pa.DataType:
        precision, scale = 10, 0  # Spark's DECIMAL without arguments
        if self.is_punct("("):
            self.i += 1
            precision = self.number("a precision")
            if self.is_punct(","):
                self.i += 1
                scale = self.number("a scale")
            self.expect_punct(")", "to close DECIMAL(p, s)")
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise self.invalid(
                f"DECIMAL({precision}, {scale}) is out of range: precision must be 1..38 and "
                "scale 0..precision",
                tok,
            )
        return pa.decimal128(precision, scale)

    def interval(self) -> pa.DataType:
        if self.is_word("year", "month"):
            raise self.fail("year-month intervals have no Arrow form in Spark; use INT months")
        if not self.is_word(*_INTERVAL_FIELDS):
            raise self.fail("expected DAY, HOUR, MINUTE or SECOND after INTERVAL")
        start = _INTERVAL_FIELDS.index(self.tok.text.lower())
        self.i += 1
        if self.is_word("to"):
            self.i += 1
            if not self.is_word(*_INTERVAL_FIELDS[start + 1 :]):
                raise self.fail("expected a smaller interval field after TO")
            self.i += 1
        return pa.duration("us")  # Spark's DayTimeIntervalType, whatever its fields


def _unquote(text: str) -> str:
    body = text[1:-1]
    return re.sub(r"\\(.)", r"\1", body)


def parse_ddl(ddl: str) -> pa.Schema:
    """The pyarrow schema Spark would give ``to_arrow_schema(DDL, timezone="UTC")``.

    Raises ``SchemaError`` naming the position of the first problem.
    """
    if not isinstance(ddl, str):
        raise SchemaError(f"a schema DDL must be a string, got {type(ddl).__name__}; {_EXAMPLE}")
    parser = _Parser(ddl)
    if parser.tok.kind == "end":
        raise SchemaError(f"the schema DDL is empty; {_EXAMPLE}")
    if parser.is_word("struct") and parser.toks[1].kind == "punct" and parser.toks[1].text == "<":
        # Spark also accepts the whole schema as one STRUCT<...> type.
        dtype = parser.type()
        if parser.tok.kind != "end":
            raise parser.fail("expected the end of the schema after STRUCT<...>")
        return pa.schema(list(dtype))
    return pa.schema(parser.columns(None))


def parse_type(ddl: str) -> pa.DataType:
    """One Spark type (``"ARRAY<INT>"``) as the pyarrow type Spark uses for it."""
    parser = _Parser(ddl)
    dtype = parser.type()
    if parser.tok.kind != "end":
        raise parser.fail("expected the end of the type")
    return dtype


# -- rendering -------------------------------------------------------------------------------

_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _quote_name(name: str) -> str:
    if _PLAIN_NAME.match(name) and name.lower() not in ("not", "comment"):
        return name
    return "`" + name.replace("`", "``") + "`"


def _field_ddl(field: pa.Field, sep: str, where: str) -> str:
    text = f"{_quote_name(field.name)}{sep}{type_to_ddl(field.type, f'{where}{field.name}')}"
    if not field.nullable:
        text += " NOT NULL"
    comment = _comment(field)
    if comment is not None:
        text += " COMMENT '" + comment.replace("\\", "\\\\").replace("'", "\\'") + "'"
    return text


def _comment(field: pa.Field) -> str | None:
    raw = (field.metadata or {}).get(SPARK_METADATA_KEY)
    if raw is None:
        return None
    try:
        value = json.loads(raw).get("comment")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) else None


def type_to_ddl(dtype: pa.DataType, where: str = "column") -> str:
    """The Spark DDL of a pyarrow type; ``SchemaError`` if Spark has no such type."""
    t = pa.types
    simple = {
        pa.bool_(): "BOOLEAN",
        pa.int8(): "TINYINT",
        pa.int16(): "SMALLINT",
        pa.int32(): "INT",
        pa.int64(): "BIGINT",
        pa.float32(): "FLOAT",
        pa.float64(): "DOUBLE",
        pa.string(): "STRING",
        pa.large_string(): "STRING",
        pa.binary(): "BINARY",
        pa.large_binary(): "BINARY",
        pa.date32(): "DATE",
    }
    if dtype in simple:
        return simple[dtype]
    if t.is_timestamp(dtype):
        return "TIMESTAMP" if dtype.tz is not None else "TIMESTAMP_NTZ"
    if t.is_decimal(dtype) and dtype.precision <= 38:
        return f"DECIMAL({dtype.precision},{dtype.scale})"
    if t.is_duration(dtype):
        return "INTERVAL DAY TO SECOND"
    if t.is_time64(dtype) or t.is_time32(dtype):
        return "TIME(6)"
    if t.is_list(dtype) or t.is_large_list(dtype):
        return f"ARRAY<{type_to_ddl(dtype.value_type, where + '[]')}>"
    if t.is_map(dtype):
        key = type_to_ddl(dtype.key_type, where + ".key")
        return f"MAP<{key},{type_to_ddl(dtype.item_type, where + '.value')}>"
    if t.is_struct(dtype):
        inner = ", ".join(_field_ddl(f, ": ", where + ".") for f in dtype)
        return f"STRUCT<{inner}>"
    hint = ""
    if t.is_unsigned_integer(dtype):
        hint = "; Spark has no unsigned integers: use a wider signed type such as int64"
    elif t.is_dictionary(dtype):
        hint = f"; decode it first (use {dtype.value_type})"
    elif t.is_float16(dtype):
        hint = "; use float32"
    raise SchemaError(f"{where}: Arrow type {dtype} has no Spark equivalent{hint}")


def to_ddl(schema: pa.Schema) -> str:
    """The schema as Spark DDL (``"a INT, b STRING NOT NULL"``); inverse of ``parse_ddl``."""
    return ", ".join(_field_ddl(f, " ", "") for f in schema)


def normalize_schema(schema: pa.Schema) -> pa.Schema:
    """The Spark form of a user's pyarrow schema (by a round trip through DDL).

    Lossless choices only: ``large_string`` becomes ``string``, any timestamp becomes
    microseconds (in UTC when it had a time zone: the same instants), list and map fields get
    Spark's field names. Types Spark lacks (unsigned integers, ...) raise ``SchemaError``
    naming the column. Other field metadata is dropped.
    """
    if not isinstance(schema, pa.Schema):
        raise SchemaError(
            f"a schema must be a Spark DDL string or a pyarrow.Schema, got {type(schema).__name__}"
        )
    return parse_ddl(to_ddl(schema)) if len(schema) else pa.schema([])
