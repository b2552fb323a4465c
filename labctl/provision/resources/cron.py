"""`cron`: labctl's own scheduled jobs, never overlapping, logging to /var/log/labctl.

Each job is one file, marked so re-runs find it: /etc/cron.d/labctl-NAME on hosts with
cron, or a systemd service + timer where systemd runs (PID 1). The command runs under
`flock -n`, so a slow run is never joined by the next one.
"""

from __future__ import annotations

import re
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from labctl.agent.core import paths
from labctl.provision.resource import Change, Params, PlanError, Probes, Resource, State
from labctl.provision.resources.files import plan_file
from labctl.transport.shell import command_line, quote

CRON_DIR = "/etc/cron.d"
UNIT_DIR = "/etc/systemd/system"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,48}\Z")
USER_RE = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}\Z")
# One element of a field: `*`, `N` or `A-B`, then a step `/S` only after `*` or a range (as
# Debian's cron reads it: `5/10` is an error there).
PART_RE = re.compile(r"(?:(\*)|(\d+)-(\d+)|(\d+))(?:/(\d+))?", re.ASCII)
RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]
FIELD_NAMES = ["minute", "hour", "day of month", "month", "day of week"]
DOW = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]


def check_schedule(schedule: str) -> list[str]:
    """The five fields of a cron schedule, each checked element by element; a ValueError
    says which field is wrong and why (cron itself would only skip the line, silently)."""
    if any(ord(c) < 32 and c != "\t" for c in schedule):
        raise ValueError("the schedule contains a control character (a newline?); write it on one line")
    fields = schedule.split()
    if len(fields) != 5:
        raise ValueError(f"'{schedule}' needs 5 fields (minute hour day month weekday), e.g. '0 */4 * * *'")
    for f, (lo, hi), name in zip(fields, RANGES, FIELD_NAMES, strict=True):
        for part in f.split(","):
            _check_part(part, f, lo, hi, name)
    return fields


def _check_part(part: str, f: str, lo: int, hi: int, name: str) -> None:
    m = PART_RE.fullmatch(part)
    if m is None:
        if re.search(r"[A-Za-z]", part):
            raise ValueError(
                f"{name} field '{f}': write numbers, not names ({name} runs {lo}-{hi}"
                + (", 0 and 7 are Sunday)" if name == "day of week" else ")")
            )
        raise ValueError(
            f"{name} field '{f}' is not cron syntax: numbers, *, a-b, */n or a-b/n, joined by commas"
        )
    star, a, b, single, step = m.groups()
    for n in (a, b, single):
        if n is not None and not lo <= int(n) <= hi:
            raise ValueError(f"{name} field '{f}': {n} is outside {lo}-{hi}")
    if a is not None and int(a) > int(b):
        raise ValueError(f"{name} field '{f}': the range {a}-{b} runs backwards; write {b}-{a}")
    if single is not None and step is not None:
        raise ValueError(
            f"{name} field '{f}': a step needs * or a range before it, e.g. */{step} or {single}-{hi}/{step}"
        )
    if step is not None:
        span = (hi - lo) if star else (int(b) - int(a))
        if not 1 <= int(step) <= max(span, 1):
            raise ValueError(f"{name} field '{f}': the step {step} must be 1-{max(span, 1)}")


def _calendar_field(f: str, width: int = 2) -> str:
    """One cron field in systemd.time syntax: `*/4` → `00/4`, `1-5` → `01..05`, lists kept."""

    def one(part: str) -> str:
        if part == "*":
            return "*"
        base, _, step = part.partition("/")
        if base == "*":
            base = "0"
        if "-" in base:
            a, b = base.split("-")
            text = f"{int(a):0{width}d}..{int(b):0{width}d}"
        else:
            text = f"{int(base):0{width}d}"
        return f"{text}/{step}" if step else text

    return ",".join(one(p) for p in f.split(","))


def on_calendar(schedule: str) -> str:
    """A 5-field cron schedule as a systemd OnCalendar expression."""
    minute, hour, dom, month, dow = check_schedule(schedule)
    day_part = ""
    if dow != "*":
        days: list[str] = []
        for part in dow.split(","):
            if "/" in part:
                raise ValueError(f"weekday steps ('{part}') have no systemd equivalent; list the days")
            if "-" in part:
                a, b = (int(x) for x in part.split("-"))
                days.append(f"{DOW[a]}..{DOW[b]}")
            elif part != "*":
                days.append(DOW[int(part)])
        day_part = ",".join(days) + " "
    return f"{day_part}*-{_calendar_field(month)}-{_calendar_field(dom)} {_calendar_field(hour)}:{_calendar_field(minute)}:00"


class CronParams(Params):
    name: str = Field(description="job name (lower case, digits, - or _), e.g. name: rotate")
    schedule: Optional[str] = Field(None, description="cron schedule, e.g. schedule: '0 */4 * * *'")
    command: Optional[str] = Field(None, description="shell command, e.g. command: labctl rotate")
    user: str = Field("root", description="user the job runs as")
    state: Literal["present", "absent"] = "present"
    backend: Literal["auto", "cron", "systemd"] = Field(
        "auto", description="auto: a systemd timer where systemd runs, else /etc/cron.d"
    )

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.match(v):
            raise ValueError(f"'{v}' must be lower case letters, digits, '-' or '_'")
        return v

    @field_validator("schedule")
    @classmethod
    def _schedule(cls, v: Optional[str]) -> Optional[str]:
        return None if v is None else " ".join(check_schedule(v))

    @field_validator("command")
    @classmethod
    def _command(cls, v: Optional[str]) -> Optional[str]:
        # A newline would end the cron line and start another, run as another entry.
        if v is not None and any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in v):
            raise ValueError(
                "the command contains a control character (a newline?); write one line, joining steps with ; or &&"
            )
        if v is not None and not v.strip():
            raise ValueError("the command is empty")
        return v

    @field_validator("user")
    @classmethod
    def _user(cls, v: str) -> str:
        if not USER_RE.match(v):
            raise ValueError(f"{v!r} is not a user name (lower case letters, digits, '_', '-' or '.')")
        return v

    @model_validator(mode="after")
    def _timer_can_say_it(self) -> CronParams:
        if self.schedule is not None and self.backend != "cron":
            try:
                on_calendar(self.schedule)
            except ValueError as e:
                raise ValueError(f"{e}, or set backend: cron") from None
        return self


def locked_command(name: str, command: str) -> str:
    return command_line(["flock", "-n", f"{paths.LOCK_DIR}/{name}.lock", "sh", "-c", command])


def job_line(name: str, command: str) -> str:
    """The shell line cron or the timer runs: the locked command, logged, then its end time and
    exit code recorded in paths.job_status(name) for `labctl cron list`; it exits as the job did.

    flock -n exits 1 when another run holds the lock: that run records its own result, so a 1
    while the lock is still held is not recorded (a job that itself exited 1 left it free).
    """
    lock = quote(f"{paths.LOCK_DIR}/{name}.lock")
    log = quote(f"{paths.LOG_DIR}/{name}.log")
    status = quote(paths.job_status(name))
    return (
        f"{locked_command(name, command)} >>{log} 2>&1; rc=$?; "
        f"if [ $rc -ne 1 ] || flock -n {lock} true; then "
        f'echo "$rc $(date +%s)" >{status}.tmp && mv -f {status}.tmp {status}; fi; exit $rc'
    )


def marks(p: CronParams) -> str:
    """Comment lines `labctl cron list` reads back: the schedule and the command as given."""
    return f"# labctl:schedule: {p.schedule}\n# labctl:command: {p.command}\n"


def cron_file(p: CronParams) -> str:
    assert p.schedule and p.command
    # cron turns an unescaped % into a newline (the rest becomes the command's stdin).
    line = job_line(p.name, p.command).replace("%", "\\%")
    return (
        f"# labctl:cron:{p.name} (written by labctl provision; edits here are overwritten)\n"
        + marks(p)
        + "SHELL=/bin/sh\n"
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        f"{p.schedule} {p.user} {line}\n"
    )


def unit_escape(text: str) -> str:
    """`text` as systemd reads it back in ExecStart: it expands %specifiers, $VARIABLES and
    C escapes (backslashes) even inside quotes."""
    return text.replace("\\", "\\\\").replace("%", "%%").replace("$", "$$")


def systemd_units(p: CronParams) -> tuple[str, str]:
    assert p.schedule and p.command
    command = quote(job_line(p.name, p.command))
    service = (
        f"# labctl:cron:{p.name}\n{marks(p)}[Unit]\nDescription=labctl job {p.name}\n\n[Service]\nType=oneshot\nUser={p.user}\n"
        f"ExecStart=/bin/sh -c {unit_escape(command)}\n"
    )
    timer = (
        f"# labctl:cron:{p.name}\n[Unit]\nDescription=labctl job {p.name} ({p.schedule})\n\n"
        f"[Timer]\nOnCalendar={on_calendar(p.schedule)}\nPersistent=true\n\n[Install]\nWantedBy=timers.target\n"
    )
    return service, timer


class Cron(Resource):
    type_name = "cron"
    params_model = CronParams
    description = "a scheduled labctl job (cron.d or systemd timer), flock-wrapped, logged"
    params: CronParams

    def label(self) -> str:
        return f"cron {self.params.name}"

    def _paths(self) -> dict[str, str]:
        n = self.params.name
        return {
            "cron": f"{CRON_DIR}/labctl-{n}",
            "service": f"{UNIT_DIR}/labctl-{n}.service",
            "timer": f"{UNIT_DIR}/labctl-{n}.timer",
        }

    def probes(self) -> Probes:
        probes: Probes = {k: {"kind": "file", "path": v} for k, v in self._paths().items()}
        probes["system"] = {"kind": "system"}
        probes["logdir"] = {"kind": "file", "path": paths.LOG_DIR}
        probes["lockdir"] = {"kind": "file", "path": paths.LOCK_DIR}
        if self.params.backend != "cron":
            name = f"labctl-{self.params.name}.timer"
            probes["enabled"] = {
                "kind": "command",
                "cmd": f"systemctl is-enabled {quote(name)} 2>/dev/null; systemctl is-active {quote(name)} 2>/dev/null; true",
            }
        return probes

    def plan(self, state: State) -> Change:
        p = self.params
        if p.state == "present" and (not p.schedule or not p.command):
            raise PlanError(
                f"cron job '{p.name}' needs schedule and command.", "Add both, or set state: absent."
            )
        systemd = p.backend == "systemd" or (p.backend == "auto" and bool(state["system"].get("systemd")))
        files = self._paths()
        change = Change()
        present = p.state == "present"
        for d, key in ((paths.LOG_DIR, "logdir"), (paths.LOCK_DIR, "lockdir")):
            if present and not state[key].get("is_dir"):
                change.add(f"create {d}", {"op": "mkdir", "path": d, "mode": 0o755})
        wanted: dict[str, str | None] = {"cron": None, "service": None, "timer": None}
        if present and systemd:
            wanted["service"], wanted["timer"] = systemd_units(p)
        elif present:
            wanted["cron"] = cron_file(p)
        for key, text in wanted.items():
            sub = plan_file(files[key], text, state[key], mode=0o644 if text is not None else None)
            change.ops += sub.ops
            change.summary += sub.summary
            change.diffs += sub.diffs
        timer = f"labctl-{p.name}.timer"
        enabled = (state.get("enabled") or {}).get("stdout", "").split()
        if systemd and present and (change.changed or enabled[:2] != ["enabled", "active"]):
            change.add(
                f"enable and start {timer}",
                {"op": "run", "argv": ["systemctl", "daemon-reload"]},
                {"op": "run", "argv": ["systemctl", "enable", "--now", timer]},
            )
        if not present and state["timer"].get("exists") and state["system"].get("systemd"):
            change.ops.insert(0, {"op": "run", "argv": ["systemctl", "disable", "--now", timer]})
            change.ops.append({"op": "run", "argv": ["systemctl", "daemon-reload"]})
        return change
