"""Where a pod's log was left (:class:`LogCursor`), so a dropped log stream resumes there.

- **Logs survive dropped streams.** Each pod's log is followed with ``timestamps=true``; when the stream ends while
  the container still runs, it is reopened with ``sinceTime`` at the last line seen, and lines already passed on are
  skipped (``sinceTime`` has one-second resolution).
"""

from __future__ import annotations

from dataclasses import dataclass


# -------------------------------------------------------------------------------------------------------- logs
def ts_key(ts: str) -> str:
    """Sort key of an RFC 3339 UTC timestamp with a trimmed fraction (Go's RFC3339Nano: ``...:05.1Z`` comes
    before ``...:05.12Z``, which plain string order gets wrong)."""
    base, _, frac = ts.rstrip("Z").partition(".")
    return f"{base}.{frac.ljust(9, '0')}"


@dataclass
class LogCursor:
    """Where a pod's log was left: the timestamp of the last line passed on, how many lines carried it, and how
    many lines of that timestamp the current stream has replayed (``sinceTime`` has one-second resolution)."""

    last_ts: str = ""
    at_last: int = 0
    replayed: int = 0
    final_read: bool = False
    done: bool = False

    def since_time(self) -> str | None:
        """``sinceTime`` for a reopened stream: the last timestamp cut to whole seconds (the API's resolution)."""
        return self.last_ts[:19] + "Z" if self.last_ts else None

    def reopen(self) -> None:
        """A new stream starts: lines of the last timestamp are replayed from the first."""
        self.replayed = 0

    def accept(self, ts: str) -> bool:
        """Whether a line stamped ``ts`` (the kubelet's RFC 3339 UTC, fraction trimmed) was not passed on yet."""
        if not self.last_ts or ts_key(ts) > ts_key(self.last_ts):
            self.last_ts, self.at_last, self.replayed = ts, 1, 1
            return True
        if ts_key(ts) == ts_key(self.last_ts):
            self.replayed += 1
            if self.replayed > self.at_last:
                self.at_last += 1
                return True
        return False
