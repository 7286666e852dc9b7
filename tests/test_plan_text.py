"""Reading Spark's plan text (the query-shape checks in both modes, issue 22), without Spark.

The plans below are Spark 4.3's analyzed plans as ``explain(True)`` printed them, in classic
Spark and through a Spark Connect server (the same text); integration/test_query_shapes.py and
integration/test_connect.py check the same findings against a real session in each mode.
"""

from __future__ import annotations

from pyspark_rowtime.watermark import check_plan, parse_plan

SOURCE = (
    "~StreamingRelationV2 org.apache.spark.sql.execution.datasources.v2.python."
    "PythonDataSourceV2@f37317, rowtime, org.apache.spark.sql.execution.datasources.v2.python."
    "PythonTable@47953985, [path=/tmp/s], [k#{0}, v#{1}, rowtime#{2}, is_bound#{3}], "
    "name=<Unassigned>"
)
BARRIER = (
    "~Filter (CASE WHEN isnotnull(rowtime#2-T1ms) THEN NOT is_bound#3 ELSE false END AND "
    "(SPARK_PARTITION_ID() >= 0))"
)
WATERMARK = "~EventTimeWatermark 4c92c292-5d9b-4c53-8fdb-70e7a8e7a488, rowtime#2: timestamp, {}"


def source(*ids: int) -> str:
    return SOURCE.format(*(ids or (0, 1, 2, 3)))


def test_the_tree_follows_spark_s_indentation() -> None:
    text = "\n".join(
        [
            "~Filter (k#0 = a)",
            "+- ~Union false, false",
            "   :- " + source(),
            "   +- " + source(14, 15, 16, 17),
        ]
    )
    root = parse_plan(text)
    assert root is not None and root.name == "Filter" and root.args == "(k#0 = a)"
    (union,) = root.children
    assert union.name == "Union"
    assert [c.name for c in union.children] == ["StreamingRelationV2"] * 2


def test_a_protected_watermark_is_fine_and_a_bare_one_is_named() -> None:
    protected = "\n".join(
        [
            "~Aggregate [k#0], [k#0, count(1) AS count#4L]",
            "+- ~Filter (k#0 = a)",
            "   +- ~Project [k#0, v#1, rowtime#2-T1ms]",
            "      +- " + BARRIER,
            "         +- " + WATERMARK.format("0.001 seconds"),
            "            +- " + source(),
        ]
    )
    assert check_plan(protected) == []
    bare = "\n".join(
        ["~Filter (v#1 > 1)", "+- " + WATERMARK.format("1 seconds"), "   +- " + source()]
    )
    (problem,) = check_plan(bare)
    assert problem.startswith("withWatermark('rowtime') on a format('rowtime') stream without")


def test_a_filter_below_a_bare_watermark_is_named_without_ids() -> None:
    text = "\n".join(
        [
            WATERMARK.format("1 seconds"),
            "+- ~Filter atleastnnonnulls(4, k#0, v#1, rowtime#2-T1ms, is_bound#3)",
            "   +- " + source(),
        ]
    )
    problems = check_plan(text)
    assert problems[0].startswith(
        "a filter atleastnnonnulls(4, k, v, rowtime, is_bound) stands between"
    )
    assert len(problems) == 2  # and the bare watermark itself


def test_an_expression_s_inner_plan_is_not_taken_for_an_operator() -> None:
    """Spark prints a subquery's plan two levels below the operator holding it."""
    text = "\n".join(
        [
            "~Filter exists#5 [k#0]",
            ":  +- Project [x#6]",
            ":     +- LocalRelation <empty>, [x#6]",
            "+- " + WATERMARK.format("1 seconds"),
            "   +- " + source(),
        ]
    )
    root = parse_plan(text)
    assert root is not None
    assert [c.name for c in root.children] == ["EventTimeWatermark"]


def test_no_plan_no_findings() -> None:
    assert parse_plan("") is None
    assert check_plan("") == []


def test_an_aggregate_s_output_is_read_as_one_call_or_not() -> None:
    """time_interval_aggregate under Spark Connect reads its aggregate from the plan text."""
    from pyspark_rowtime.windows.aggregate import _one_call, _split_top

    assert _split_top("[k#0], [k#0, max_by(a#1, b#2) AS m#7]") == [
        "[k#0]",
        "[k#0, max_by(a#1, b#2) AS m#7]",
    ]
    assert _one_call("max_by(a#1, (b#2 * 2))") == ("max_by", ["a#1", "(b#2 * 2)"])
    assert _one_call("count(distinct v#24)") == ("count", ["distinct v#24"])
    assert _one_call("max(v#40) FILTER (WHERE (v#40 > 1))") is None
    assert _one_call("(max(v#1) + 1)") is None
    assert _one_call("max(v#1) + min(v#1)") is None
