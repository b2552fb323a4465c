"""What each free cloud platform allows (seed 001), and a session's time limit within it.

Seed 001: Kaggle gives 30 GPU hours a week on a P100 16 GB in sessions of at most 12 h;
SageMaker's free tier gives 4 h a day on ml.p3.2xlarge (V100 16 GB). A session ends when its
time is up whether the training is done or not, so the trainer is told to stop a margin
before that (the `time_limit` trainer setting) and to leave a checkpoint the next session
resumes from.
"""

from __future__ import annotations

from dataclasses import dataclass

from labctl.output.errors import InputError
from labctl.train.duration import format_duration

HOUR = 3600
# SageMaker's own ceiling for StoppingCondition.MaxRuntimeInSeconds (28 days).
SAGEMAKER_MAX_RUNTIME_S = 28 * 24 * HOUR


@dataclass(frozen=True)
class Platform:
    name: str
    gpu: str
    session_max_s: int  # the longest one session may run
    weekly_s: int | None  # the free quota per week
    daily_s: int | None  # the free quota per day
    # Taken off the session for what is not training: the machine starting, the checkpoint
    # written at the limit and copied out, the output saved.
    margin_s: int
    source: str

    def limits(self, requested_s: int | None, flag: str = "--time-limit") -> tuple[int, int]:
        """(the session's length, the trainer's time_limit) for `requested_s` (None: the longest allowed).

        A short session keeps a tenth of itself as margin, so a test's 60 s session still trains.
        """
        session = self.session_max_s if requested_s is None else requested_s
        if session > self.session_max_s:
            raise InputError(
                f"{flag} {format_duration(session)} is over {self.name}'s {format_duration(self.session_max_s)} "
                f"per session ({self.source}).",
                f"Give {flag} {format_duration(self.session_max_s)} or less; the run resumes in the next session.",
            )
        margin = min(self.margin_s, session // 10)
        return session, session - margin


KAGGLE = Platform(
    name="Kaggle",
    gpu="P100 16 GB",
    session_max_s=12 * HOUR,
    weekly_s=30 * HOUR,
    daily_s=None,
    margin_s=30 * 60,
    source="Kaggle's free tier: 30 GPU h/week, sessions of at most 12 h",
)
SAGEMAKER = Platform(
    name="SageMaker",
    gpu="V100 16 GB (ml.p3.2xlarge)",
    session_max_s=min(4 * HOUR, SAGEMAKER_MAX_RUNTIME_S),
    weekly_s=28 * HOUR,
    daily_s=4 * HOUR,
    margin_s=10 * 60,
    source="the SageMaker quota planned for: 4 h/day on ml.p3.2xlarge",
)
SAGEMAKER_INSTANCE = "ml.p3.2xlarge"
PLATFORMS = {"kaggle": KAGGLE, "sagemaker": SAGEMAKER}
