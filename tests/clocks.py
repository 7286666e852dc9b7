"""A clock tests drive by hand: the writer takes any callable returning microseconds."""

from __future__ import annotations

T0 = 1_700_000_000_000_000  # 2023-11-14T22:13:20Z in microseconds


class FakeClock:
    """Arrival clock driven by the test: returns ``now`` and then advances it by ``step``."""

    def __init__(self, now: int = T0, step: int = 1) -> None:
        self.now, self.step = now, step

    def __call__(self) -> int:
        value = self.now
        self.now += self.step
        return value
