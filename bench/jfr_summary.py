"""Where the JVM spends a benchmark: a summary of a Java Flight Recorder file.

``./dev bench suite --cases floor --jfr /tmp/floor.jfr`` records the JVM (local mode: the
driver runs the tasks); then ``./dev bench jfr_summary /tmp/floor.jfr`` prints, for the threads
that run Spark tasks, the share of samples by what the stack is doing (the first rule in
:data:`KINDS` that one of its frames matches, searched from the top of the stack) and the
hottest methods at the top of the stack.

Two kinds of sample: ``jdk.ExecutionSample`` (a thread running Java code) and
``jdk.NativeMethodSample`` (a thread inside a native method: mostly waiting on a socket, here
the Python worker's). Their sampling periods differ (10 ms and 20 ms under
``settings=profile`` on JDK 17), so each is summarised on its own.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from collections.abc import Iterable
from typing import Any

#: (kind, substrings of a frame's ``class.method``): the first that matches names the sample.
KINDS: list[tuple[str, tuple[str, ...]]] = [
    ("read the Python worker's socket", ("SocketInputStream", "NioSocketImpl", "SocketDispatcher")),
    ("read Arrow IPC from the worker", ("org.apache.arrow.vector.ipc", "MessageSerializer")),
    (
        "Arrow vectors read (bounds-checked ArrowBuf)",
        ("ArrowColumnVector", "ColumnarBatch", "ColumnarToRow", "org.apache.arrow.memory"),
    ),
    (
        "UnsafeRow written (null bits, string bytes)",
        ("UnsafeRowWriter", "UnsafeWriter", "UTF8String"),
    ),
    ("rows queued (BufferedRowIterator)", ("BufferedRowIterator.append", "LinkedList")),
    ("generated code (projection, aggregation)", ("GeneratedClass", "GeneratedIterator")),
    ("Parquet scan", ("parquet",)),
    ("shuffle and sort", ("shuffle", "ExternalSorter", "UnsafeExternalSorter")),
    ("noop sink", ("noop",)),
    ("Python runner (JVM side)", ("org.apache.spark.api.python", "sql.execution.python")),
    ("memory (allocation, copy)", ("Unsafe.copyMemory", "Platform.", "MemoryAllocator")),
]


def task_thread(name: str) -> bool:
    return name.startswith("Executor task launch worker")


def frames(event: dict[str, Any]) -> list[str]:
    out = []
    for f in event["values"]["stackTrace"]["frames"]:
        m = f["method"]
        out.append(f"{m['type']['name']}.{m['name']}")
    return out


def kind_of(stack: Iterable[str]) -> str:
    for frame in stack:
        for kind, needles in KINDS:
            if any(n in frame for n in needles):
                return kind
    return "other"


def load(path: str, event: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        ["jfr", "print", "--json", "--stack-depth", "64", "--events", event, path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)["recording"]["events"]


def summarise(path: str, event: str, top: int = 12) -> dict[str, Any]:
    kinds: collections.Counter[str] = collections.Counter()
    tops: collections.Counter[str] = collections.Counter()
    n = 0
    for e in load(path, event):
        thread = (e["values"].get("sampledThread") or {}).get("javaName") or ""
        if not task_thread(thread) or not e["values"].get("stackTrace"):
            continue
        stack = frames(e)
        n += 1
        kinds[kind_of(stack)] += 1
        tops[stack[0]] += 1
    return {"samples": n, "kinds": kinds.most_common(), "top": tops.most_common(top)}


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: jfr_summary.py RECORDING.jfr")
    for event in ("jdk.ExecutionSample", "jdk.NativeMethodSample"):
        s = summarise(argv[0], event)
        print(f"\n{event}: {s['samples']} samples of task threads")
        for kind, c in s["kinds"]:
            print(f"  {c / max(1, s['samples']):6.1%}  {kind}")
        print("  hottest methods at the top of the stack:")
        for frame, c in s["top"]:
            print(f"  {c / max(1, s['samples']):6.1%}  {frame}")


if __name__ == "__main__":
    main(sys.argv[1:])
