"""The plan file (playbooks/plan.yaml): the platforms a week of training can use and the jobs
to place on them, validated like every other document (file:line, did-you-mean, exit 2)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from labctl.documents.defaults import shown_path
from labctl.documents.loader import load_model
from labctl.inventory.model import Strict

DEFAULT_PLAN = Path("playbooks/plan.yaml")
Day = Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
DAYS: tuple[Day, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
CLOCK = re.compile(r"(?:([01][0-9]|2[0-3]):([0-5][0-9])|24:00)\Z")
# Bounds far past any real job that keep the week's arithmetic in floats: a step count of 400
# digits or a rate of 1e-320 tokens/s would overflow it (or divide by zero) instead of planning.
MAX_COUNT = 10**15
MIN_RATE, MAX_RATE = 1e-3, 1e12


def clock_minutes(text: str) -> int:
    hours, minutes = text.split(":")
    return int(hours) * 60 + int(minutes)


class Window(Strict):
    days: list[Day] = Field(
        default_factory=lambda: list(DAYS), description="weekday names, e.g. days: [mon, tue, wed]"
    )
    start: str = Field(description="a time of day HH:MM, e.g. start: '08:00'")
    end: str = Field(description="a time of day HH:MM after start (24:00 is midnight), e.g. end: '22:00'")

    @field_validator("start", "end")
    @classmethod
    def _clock(cls, v: str) -> str:
        if not CLOCK.match(v):
            raise ValueError(f"'{v}' is not a time of day HH:MM")
        return v

    @model_validator(mode="after")
    def _order(self) -> Window:
        if clock_minutes(self.end) <= clock_minutes(self.start):
            raise ValueError(f"the window ends ({self.end}) before it starts ({self.start})")
        return self


class Platform(Strict):
    name: str = Field(min_length=1, description="a name, e.g. name: kaggle")
    gpu: str = Field(min_length=1, description="the GPU type, e.g. gpu: P100")
    weekly_hours: float = Field(ge=0, le=168, description="the weekly quota in hours, e.g. weekly_hours: 30")
    max_session_hours: float = Field(
        gt=0, le=168, description="the longest session in hours, e.g. max_session_hours: 12"
    )
    daily_hours: Optional[float] = Field(
        default=None, gt=0, le=24, description="hours a calendar day allows, e.g. daily_hours: 4"
    )
    windows: list[Window] = Field(
        default_factory=list,
        description="when sessions may run, e.g. windows: [{start: '08:00', end: '22:00'}]",
    )
    lab: bool = Field(default=False, description="true for the lab's own GPUs")


class Job(Strict):
    name: str = Field(min_length=1, description="a name, e.g. name: cet-phase1")
    phase: Optional[int] = Field(
        default=None,
        ge=1,
        description="the training phase (matches `labctl train --phase` runs), e.g. phase: 1",
    )
    steps_left: int = Field(
        gt=0, le=MAX_COUNT, description="the steps still to train, e.g. steps_left: 20000"
    )
    from_step: int = Field(
        default=0, ge=0, le=MAX_COUNT, description="the step its checkpoint holds now, e.g. from_step: 0"
    )
    tokens_per_step: int = Field(
        gt=0,
        le=MAX_COUNT,
        description="tokens in one optimizer step (global batch x seq_len), e.g. tokens_per_step: 524288",
    )
    tokens_per_s: dict[str, float] = Field(
        default_factory=dict,
        description="tokens/s on one GPU by type, e.g. tokens_per_s: {V100: 9000}",
    )
    precision: Literal["fp16", "fp32"] = Field(
        default="fp16", description="fp16 (mixed precision) or fp32: which column of the GPU table scales it"
    )
    gpus: list[str] = Field(
        default_factory=list,
        description="the GPU types it may run on (default: any), e.g. gpus: [V100, P100]",
    )
    priority: int = Field(default=0, description="lower runs first; equal keeps the file's order")
    checkpoint_minutes: float = Field(
        default=10, ge=0, description="minutes kept free at a session's end to write the checkpoint"
    )

    @field_validator("tokens_per_s")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        for gpu, rate in v.items():
            if not MIN_RATE <= rate <= MAX_RATE:
                raise ValueError(f"tokens_per_s for {gpu} must be from {MIN_RATE:g} to {MAX_RATE:g}")
        return v


class PlanFile(Strict):
    platforms: list[Platform] = Field(min_length=1, description="a list of platforms")
    jobs: list[Job] = Field(min_length=1, description="a list of jobs")

    @model_validator(mode="after")
    def _unique(self) -> PlanFile:
        for kind, names in (
            ("platform", [p.name for p in self.platforms]),
            ("job", [j.name for j in self.jobs]),
        ):
            twice = sorted({n for n in names if names.count(n) > 1})
            if twice:
                raise ValueError(f"{kind} names must be unique: {', '.join(twice)} appears twice")
        return self


def packaged_path() -> Path:
    from importlib import resources

    return Path(str(resources.files("labctl") / "data" / "playbooks" / "plan.yaml"))


def default_path(inventory_path: Path) -> Path:
    """playbooks/plan.yaml beside the inventory, then its parent, then here (like alerts.yaml)."""
    from labctl.documents.defaults import find_default

    return find_default(DEFAULT_PLAN, inventory_path, "plan file", "-f")


def load_plan(path: Path) -> PlanFile:
    """The plan file at `path`, validated: every problem at once (exit 2)."""
    return load_model(
        path,
        "plan file",
        PlanFile,
        missing_hint=f"Pass one with -f, or get the default {DEFAULT_PLAN} with `labctl init`.",
        shape="a plan file is a mapping: platforms: [...], jobs: [...]",
        # -f always: without it, plan week would read the default file, not this one
        then=f"`labctl plan week -f {shlex.quote(shown_path(path))}` reads it again",
    )
