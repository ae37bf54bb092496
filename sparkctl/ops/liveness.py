"""Is a rank still the run serve started? The health wait's judgment of one container (pure).

"Running" at a look is not enough: a rank that fails at start is run again by docker's restart policy
(on-failure), and under load each try can last long enough for docker to reset its back-off, so the
rank reads ``running`` at every look while it never serves. What serve started is known exactly --
the container ID ``docker run -d`` printed, and a new container's RestartCount of 0 -- so any of
these ends the wait at once instead of after the whole health timeout:

- the container is gone, or another container holds its name (another ID);
- docker restarted it (RestartCount above 0), whatever its state now;
- it is not running (exited, restarting, dead);
- its StartedAt moved since the first look (a ``docker restart`` by hand does not count in RestartCount).
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.commands.serve import Container


def _times(count: int) -> str:
    return f"{count} time{'s' if count != 1 else ''}"


def restarted_words(seen: Container) -> str:
    """What a restarted container went through and where it is now, in words."""
    if seen.running:
        now = f"running again since {seen.started_at[:19]}"
    elif seen.status == "restarting":
        now = f"restarting after exit code {seen.exit_code}"
    else:
        now = seen.describe()
    return f"failed and docker restarted it {_times(seen.restart_count)} since serve started it ({now})"


@dataclass
class RankWatch:
    """One rank serve started: its host, rank, container name and the ID ``docker run`` printed."""

    host: str
    rank: int
    container: str
    container_id: str = ""  # empty when unknown: any container of the name is taken as this one
    started_at: str = ""  # StartedAt at the first look that saw it running

    @property
    def label(self) -> str:
        return f"{self.host} (rank {self.rank})"

    def why_not(self, seen: Container | None) -> str | None:
        """None while ``seen`` (the container of that name now, None when gone) is the run serve started,
        running and never restarted; else what happened, in one phrase naming the host and rank."""
        name = f"container {self.container}"
        if seen is None:
            return f"{self.label}: {name} is gone"
        if self.container_id and not seen.id.startswith(self.container_id) and not self.container_id.startswith(seen.id):
            return f"{self.label}: {name} was replaced by another container ({seen.id[:12]}, serve started {self.container_id[:12]})"
        if seen.restart_count > 0:
            return f"{self.label}: {name} {restarted_words(seen)}"
        if not seen.running:
            return f"{self.label}: {name} {seen.describe()}"
        if self.started_at and seen.started_at != self.started_at:
            return f"{self.label}: {name} was restarted at {seen.started_at[:19]} (serve saw it start at {self.started_at[:19]})"
        self.started_at = seen.started_at
        return None
