"""Progress of a replay on a terminal: events applied, events/s, lag behind the live projector, ETA."""

from __future__ import annotations

import time
from collections import deque
from typing import TextIO

from graphledger_server.telemetry import replay as telemetry

PRINT_INTERVAL_S = 2.0
RATE_WINDOW_S = 10.0


class Progress:
    """Prints a line at most every `interval_s` (and on `final`), and reports the progress gauge."""

    def __init__(self, out: TextIO | None, interval_s: float = PRINT_INTERVAL_S, worker: str = "0/1") -> None:
        self.out = out
        self.worker = worker
        """`i/N`: the worker of a replay split by partition whose progress this is."""
        self.interval_s = interval_s
        self.started = time.monotonic()
        self._samples: deque[tuple[float, int]] = deque([(self.started, 0)])
        self._printed = 0.0

    def rate(self, records: int, now: float) -> float:
        """Records per second over the last `RATE_WINDOW_S`."""
        self._samples.append((now, records))
        while len(self._samples) > 2 and now - self._samples[1][0] > RATE_WINDOW_S:
            self._samples.popleft()
        t0, r0 = self._samples[0]
        return (records - r0) / (now - t0) if now > t0 else 0.0

    def update(
        self, phase: str, records: int, lag: int, positions: dict[tuple[str, int], int],
        caps: dict[tuple[str, int], int], *, final: bool = False,
    ) -> str:  # fmt: skip
        """Report (gauge always, terminal when due); returns the line."""
        now = time.monotonic()
        rate = self.rate(records, now)
        telemetry.report_progress(positions, caps, self.worker)
        eta = f"{lag / rate:,.0f}s" if rate > 0 else "–"
        who = "" if self.worker == "0/1" else f" worker {self.worker}"
        line = f"replay{who} {phase}: {records:,} events applied, {rate:,.0f} events/s, lag {lag:,} events, ETA {eta}"
        if self.out is not None and (final or now - self._printed >= self.interval_s):
            print(line, file=self.out, flush=True)
            self._printed = now
        return line
