"""The JVM-free Spark DDL parser gives what Spark's ``to_arrow_schema(..., timezone="UTC")`` gives.

The expected schemas below were checked once against Spark 4.3's own parser
(``_parse_datatype_string`` + ``to_arrow_schema``); they are spelled out here so the test needs
no JVM.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from pyspark_rowtime.bounds.errors import SchemaError
from pyspark_rowtime.streams.ddl import (
    SPARK_METADATA_KEY,
    normalize_schema,
    parse_ddl,
    parse_type,
    to_ddl,
)

UTC = pa.timestamp("us", tz="UTC")


def element(t: pa.DataType) -> pa.DataType:
    return pa.list_(pa.field("element", t))


def spark_map(k: pa.DataType, v: pa.DataType) -> pa.DataType:
    return pa.map_(pa.field("key", k, nullable=False), pa.field("value", v))


PRIMITIVES = [
    ("BOOLEAN", pa.bool_()),
    ("tinyint", pa.int8()),
    ("BYTE", pa.int8()),
    ("smallint", pa.int16()),
    ("Short", pa.int16()),
    ("INT", pa.int32()),
    ("integer", pa.int32()),
    ("BIGINT", pa.int64()),
    ("long", pa.int64()),
    ("FLOAT", pa.float32()),
    ("real", pa.float32()),
    ("DOUBLE", pa.float64()),
    ("STRING", pa.string()),
    ("varchar(10)", pa.string()),
    ("char(3)", pa.string()),
    ("BINARY", pa.binary()),
    ("DATE", pa.date32()),
    ("TIMESTAMP", UTC),
    ("timestamp_ltz", UTC),
    ("TIMESTAMP_NTZ", pa.timestamp("us")),
    ("DECIMAL", pa.decimal128(10, 0)),
    ("DECIMAL(10,2)", pa.decimal128(10, 2)),
    ("dec(5)", pa.decimal128(5, 0)),
    ("NUMERIC(38, 38)", pa.decimal128(38, 38)),
    ("INTERVAL DAY TO SECOND", pa.duration("us")),
    ("interval hour", pa.duration("us")),
    ("TIME", pa.time64("ns")),
    ("ARRAY<STRING>", element(pa.string())),
    ("MAP<STRING,INT>", spark_map(pa.string(), pa.int32())),
    ("STRUCT<x: INT, y: DOUBLE>", pa.struct([("x", pa.int32()), ("y", pa.float64())])),
    ("struct<x int not null>", pa.struct([pa.field("x", pa.int32(), nullable=False)])),
    ("STRUCT<>", pa.struct([])),
    (
        "array<map<string, struct<q: bigint>>>",
        element(spark_map(pa.string(), pa.struct([("q", pa.int64())]))),
    ),
]


@pytest.mark.parametrize(("ddl", "expected"), PRIMITIVES, ids=[c[0] for c in PRIMITIVES])
def test_each_spark_type_maps_to_the_arrow_type_spark_uses(ddl: str, expected: pa.DataType):
    assert parse_type(ddl) == expected
    assert parse_ddl(f"c {ddl}").field("c").type == expected


def test_the_issue_example_parses_to_sparks_schema():
    schema = parse_ddl(
        "a INT, b STRING, ts TIMESTAMP, d DECIMAL(10,2), tags ARRAY<STRING>, "
        "m MAP<STRING,INT>, s STRUCT<x: INT, y: DOUBLE>"
    )
    assert schema == pa.schema(
        [
            ("a", pa.int32()),
            ("b", pa.string()),
            ("ts", UTC),
            ("d", pa.decimal128(10, 2)),
            ("tags", element(pa.string())),
            ("m", spark_map(pa.string(), pa.int32())),
            ("s", pa.struct([("x", pa.int32()), ("y", pa.float64())])),
        ]
    )


def test_not_null_backquotes_comments_and_colons_are_understood():
    schema = parse_ddl("A Integer NOT NULL, `we``ird name`: string comment 'it\\'s', 1a int")
    assert schema.field("A") == pa.field("A", pa.int32(), nullable=False)
    weird = schema.field("we`ird name")
    assert json.loads(weird.metadata[SPARK_METADATA_KEY]) == {"comment": "it's"}
    assert schema.field("1a").type == pa.int32()


def test_a_whole_struct_type_is_accepted_as_a_schema():
    assert parse_ddl("struct<a: int, b: string>") == parse_ddl("a INT, b STRING")


def test_to_ddl_output_parses_back_to_the_same_schema_and_spells_types_in_capitals():
    ddl = (
        "a INT NOT NULL, `b c` STRING COMMENT 'x', ts TIMESTAMP, n TIMESTAMP_NTZ, "
        "d DECIMAL(10,2), l ARRAY<MAP<STRING,STRUCT<x: INT NOT NULL, y: DOUBLE>>>, "
        "i INTERVAL DAY TO SECOND, bin BINARY, day DATE, f FLOAT, t TINYINT, s SMALLINT, "
        "g BIGINT, z BOOLEAN"
    )
    schema = parse_ddl(ddl)
    assert parse_ddl(to_ddl(schema)) == schema
    assert to_ddl(parse_ddl("a int, b string")) == "a INT, b STRING"


BAD = [
    ("", "empty"),
    ("a", "position 1"),
    ("a INT,", "position 6"),
    ("a FOO", "position 2"),
    ("a INT b INT", "position 6"),
    ("a DECIMAL(50,2)", "precision must be 1..38"),
    ("a DECIMAL(5,6)", "scale 0..precision"),
    ("a INT, A STRING", "duplicate column name 'A'"),
    ("a ARRAY<INT", "to close ARRAY"),
    ("a MAP<INT>", "between the key and value types"),
    ("a STRUCT<x INT", "',' or '>'"),
    ("a INT NOT", "expected NULL"),
    ("a INTERVAL YEAR TO MONTH", "year-month"),
    ("a INT; DROP", "unexpected character ';'"),
]


@pytest.mark.parametrize(("ddl", "says"), BAD, ids=[c[0] or "empty" for c in BAD])
def test_bad_ddl_raises_schema_error_naming_the_position(ddl: str, says: str):
    with pytest.raises(SchemaError) as info:
        parse_ddl(ddl)
    message = str(info.value)
    assert says in message
    assert "name TYPE" in message  # says what to do


def test_pyarrow_schemas_are_normalized_to_sparks_form_losslessly():
    schema = pa.schema(
        [
            ("s", pa.large_string()),
            ("ts", pa.timestamp("ns", tz="Europe/Paris")),
            ("n", pa.timestamp("ms")),
            ("l", pa.list_(pa.int32())),
        ]
    )
    assert normalize_schema(schema) == pa.schema(
        [("s", pa.string()), ("ts", UTC), ("n", pa.timestamp("us")), ("l", element(pa.int32()))]
    )


@pytest.mark.parametrize(
    ("dtype", "hint"),
    [
        (pa.uint32(), "unsigned"),
        (pa.float16(), "float32"),
        (pa.dictionary(pa.int8(), pa.string()), "decode"),
    ],
)
def test_types_spark_lacks_are_refused_naming_the_column(dtype: pa.DataType, hint: str):
    with pytest.raises(SchemaError) as info:
        normalize_schema(pa.schema([("col", dtype)]))
    assert "col" in str(info.value) and hint in str(info.value)
