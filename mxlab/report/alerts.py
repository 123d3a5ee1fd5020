"""The warnings under a report's decision line, each with a severity, shown in order of what they change.

SEVERITIES is the one order: first what questions the decision itself (settings chosen after the runs,
an arm mixing recipes, a baseline still learning, too few seeds for any verdict), then what weakens
the evidence it rests on (outlying baseline seeds, a study too small for its margin, runs left out,
inputs approximated), then notes that point to a remedy.
"""

from __future__ import annotations

from dataclasses import dataclass

QUESTIONS = "questions the decision"
WEAKENS = "weakens the evidence"
NOTE = "note"
SEVERITIES: tuple[str, ...] = (QUESTIONS, WEAKENS, NOTE)


@dataclass(frozen=True)
class Alert:
    """One warning line (inline markup allowed) and its severity, one of SEVERITIES."""

    severity: str
    text: str

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"alert severity {self.severity!r} is not one of {list(SEVERITIES)}")


def ordered(alerts: list[Alert]) -> list[Alert]:
    """The alerts in SEVERITIES order, keeping the given order within a severity."""
    return sorted(alerts, key=lambda a: SEVERITIES.index(a.severity))


def questioning(alerts: list[Alert]) -> int:
    """How many of the alerts question the decision."""
    return sum(a.severity == QUESTIONS for a in alerts)
