"""The soak test, short: ``integration/soak.py`` for 30 s in its own process (its own Spark).

Four writer processes killed at random, heartbeats, random bounds and 1% disorder under
``adjust`` while a query reads and a sink writes; the script checks counts, clocks and memory
(see its docstring) and prints its figures. ``./dev soak SECONDS`` runs it for longer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "soak.py"


def test_a_short_soak_loses_nothing_and_stays_flat(tmp_path):
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "30"], capture_output=True, text=True, timeout=600, env=env
    )
    figures = json.loads(done.stdout.strip().splitlines()[-1]) if done.stdout.strip() else {}
    assert done.returncode == 0, (figures, done.stderr[-4000:])
    assert figures["ok"] and figures["writer_kills"] >= 3 and figures["inserted"] > 1000, figures
    assert figures["released"] + figures["discarded"] == figures["inserted"]
