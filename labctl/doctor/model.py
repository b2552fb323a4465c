"""One doctor line: what was checked, where, what was found, and how to fix it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass
class Line:
    status: str  # pass | warn | fail
    check: str  # a short name: "gpus", "torch covers GPUs", "clock skew", "tier dev: RAM", ...
    host: str | None  # None for a lab-wide line
    found: str
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def exit_code(lines: list[Line]) -> int:
    return 1 if any(x.status == FAIL for x in lines) else 0
