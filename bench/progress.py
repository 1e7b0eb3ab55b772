"""A one-line progress bar on stderr for benchmark cases (no dependency).

On a terminal the line is redrawn in place; elsewhere (a log file, CI) one line is printed when a
case ends, so logs stay short.
"""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class CaseBar:
    """Progress of one case: `steps` runs, with elapsed seconds."""

    def __init__(self, label: str, steps: int, stream: Optional[TextIO] = None, width: int = 24):
        self.label, self.steps, self.width = label, max(steps, 1), width
        self.stream = stream if stream is not None else sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.t0 = time.perf_counter()
        self._draw()

    def line(self) -> str:
        filled = round(self.width * self.done / self.steps)
        bar = "#" * filled + "-" * (self.width - filled)
        return f"[{bar}] {self.done}/{self.steps} {self.label} ({time.perf_counter() - self.t0:.1f} s)"

    def _draw(self) -> None:
        if self.live:
            self.stream.write("\r" + self.line())
            self.stream.flush()

    def tick(self) -> None:
        self.done = min(self.done + 1, self.steps)
        self._draw()

    def close(self) -> None:
        """Ends the line (a terminal) or prints the final state once (a log)."""
        self.stream.write(("\r" if self.live else "") + self.line() + "\n")
        self.stream.flush()
