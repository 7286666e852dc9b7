"""``./dev soak faults`` in short (issue 34): the soak script itself, a round at two fault rates
on each store this machine runs (moto's S3, Azurite, redis-server), 6 appends a round. Its long
form runs for minutes at five rising rates; the contract each round checks is in
``tests/fault_writes.py``, which ``tests/test_faults_wire.py`` runs at length."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).parent.parent / "integration" / "soak_faults.py"


def test_the_fault_soak_checks_each_round_and_sums_them_up() -> None:
    env = {**os.environ, "ROWTIME_FAULT_SEED": "20261127"}
    proc = subprocess.run(
        [sys.executable, str(SOAK), "0", "--rates", "0.1,0.4", "--flushes", "6", "--no-spark"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    rounds = [line for line in out.splitlines() if " rate " in line]
    skipped = [line for line in out.splitlines() if line.startswith("soak faults: no ")]
    stores = 3 - len(skipped)
    assert stores >= 1, out
    assert len(rounds) == 2 * stores, out  # each rate once on each store
    assert all("-> 600 records, each once, in order" in line for line in rounds), out
    totals = json.loads(out.strip().splitlines()[-1])
    assert totals["rounds"] == 2 * stores and totals["records"] == 600 * 2 * stores
    assert all(" turns, " in line for line in rounds), out  # the proxy's counts, per round
    assert any("no fault" not in line for line in rounds), out  # faults reached the writers
