"""The one progress reporter: done / total, rate and ETA on stderr.

On a terminal it is tqdm's live bar; in a log (stderr not a terminal) the same tqdm-formatted
line is printed at most every ``log_every_s`` seconds, plus once at the end, so CI logs and
``2> file`` stay readable instead of filling with carriage returns.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm


class ProgressBar:
    def __init__(self, label: str, total: int, unit: str = "it", *, enabled: bool = True,
                 out: TextIO | None = None, log_every_s: float = 5.0) -> None:
        self.label, self.total, self.unit, self.enabled = label, total, unit, enabled
        self.out = out or sys.stderr
        self.log_every_s = log_every_s
        self.done = 0
        self.postfix = ""
        self.start = self._last = time.monotonic()
        self._bar: tqdm | None = None
        if enabled and self.out.isatty():
            self._bar = tqdm(total=total, desc=label, unit=unit, file=self.out, dynamic_ncols=True, leave=True)

    def update_to(self, done: int, total: int | None = None) -> None:
        """Progress reached ``done`` (of ``total`` when it changed)."""
        if total is not None and total != self.total:
            self.total = total
            if self._bar is not None:
                self._bar.total = total
        step, self.done = done - self.done, done
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(step)
            if done >= self.total:
                self.close()
            return
        now = time.monotonic()
        if done >= self.total or now - self._last >= self.log_every_s:
            self._last = now
            self.out.write(self.line() + "\n")
            self.out.flush()

    def update(self, n: int = 1) -> None:
        self.update_to(self.done + n)

    def __call__(self, done: int, total: int) -> None:
        """The ``progress(done, total)`` callback the simulator and generators take."""
        self.update_to(done, total)

    def set_postfix(self, text: str) -> None:
        """A short note after the counts (e.g. failures, behind schedule)."""
        self.postfix = text
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=False)

    def note(self, text: str) -> None:
        """A line of its own above the bar (or in the log)."""
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text, file=self.out)
        else:
            self.out.write(text + "\n")
            self.out.flush()

    def line(self) -> str:
        meter = tqdm.format_meter(self.done, self.total, time.monotonic() - self.start, prefix=self.label,
                                  unit=self.unit, ncols=100)
        return f"{meter} {self.postfix}".rstrip()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
