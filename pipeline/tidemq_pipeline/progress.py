"""Progress lines while a job runs and the one summary line it ends with."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

__all__ = ["JobSummary"]

log = logging.getLogger("tidemq.pipeline")


@dataclass
class JobSummary:
    """Counters of one job run; ``line()`` is the summary printed when it ends."""

    job: str
    read: int = 0
    written: int = 0
    deleted: int = 0
    started: float = field(default_factory=time.monotonic)
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def progress(self, text: str) -> None:
        """Log one progress line, prefixed with the job and the time since it started."""
        log.info("%s [%.1f s] %s", self.job, self.seconds, text)

    def line(self) -> str:
        extra = "".join(f" {key}={value}" for key, value in self.extra.items())
        return (f"{self.job}: rows read={self.read} written={self.written} deleted={self.deleted}{extra} "
                f"seconds={self.seconds:.1f}")
