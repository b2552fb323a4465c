"""Host side of `labctl cron list`: labctl's scheduled jobs on this host, their last and next
run, and whether anything runs them.

A job is a marked /etc/cron.d/labctl-NAME file, or a labctl-NAME.service + .timer pair where
systemd runs (both written by the `cron` provision resource). Their `# labctl:` comment lines
say the schedule and command as given; the wrapper records each run's exit code and end time
in paths.job_status(NAME). A cron.d file does nothing without a cron daemon, so the host's
daemons are looked for in /proc. Standard library only, Python 3.8.
"""

from __future__ import annotations

import datetime
import glob
import os
import re
import time
from typing import Any, Dict, List, Optional, Set, Tuple

from ..core import paths, textedit
from ..core.spec import command

CRON_DIR = "/etc/cron.d"
UNIT_DIR = "/etc/systemd/system"
MARK_RE = re.compile(r"# labctl:(cron|schedule|command): ?(.*)\Z")
# cron cuts an entry into fields at spaces and tabs only (str.split() also cuts at U+00A0 ...).
FIELD_SEP = re.compile(r"[ \t]+")


def parse_job_file(text: str) -> Dict[str, Any]:
    """The marks of one job file, and for a cron.d file its entry: the schedule, the user and
    the shell line cron runs (its `\\%` escapes undone, as cron undoes them)."""
    out: Dict[str, Any] = {}
    # Lines as cron reads them: a command holding U+2028 or \x85 is still one line.
    for line in textedit.text_lines(text):
        m = MARK_RE.match(line)
        if m:
            kind, value = m.groups()
            if kind == "cron":
                out.setdefault("name", value.split()[0] if value.split() else "")
            else:
                out.setdefault(kind, value)
            continue
        if line.startswith("#") or not line.strip() or re.match(r"^[A-Z_]+=", line):
            continue
        fields = FIELD_SEP.split(line.lstrip(" \t"), 6)
        if len(fields) == 7 and "line" not in out:
            out.setdefault("schedule", " ".join(fields[:5]))
            out["user"] = fields[5]
            out["line"] = fields[6].replace("\\%", "%")
    return out


def _read(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def last_run(name: str) -> Optional[Dict[str, Any]]:
    problem = paths.component_problem(name)
    if problem:
        # A job file's mark names the status file: a crafted one must not reach outside LOCK_DIR.
        return {"rc": None, "end": None, "error": f"job name {name!r}: {problem}"}
    text = _read(paths.job_status(name))
    if text is None:
        return None
    parts = text.split()
    try:
        return {"rc": int(parts[0]), "end": int(parts[1])}
    except (IndexError, ValueError):
        return {"rc": None, "end": None, "error": f"unreadable: {text[:80]!r}"}


# Debian's cron and cronie, dcron and busybox's applet (each named as its binary or link is).
CRON_DAEMONS = ("cron", "crond")
RANGES = [(0, 59), (0, 23), (1, 31), (1, 12), (0, 7)]


def _number(text: str) -> int:
    # cron reads ASCII digits only; int() would also take other scripts' digits ('٥').
    if not (text.isascii() and text.isdigit()):
        raise ValueError(text)
    return int(text)


def _field(text: str, lo: int, hi: int) -> Set[int]:
    """One cron field as the values it matches; ValueError for what cron would not read."""
    out: Set[int] = set()
    for part in text.split(","):
        base, _, step = part.partition("/")
        if base == "*":
            a, b = lo, hi
        elif "-" in base:
            a, b = (_number(x) for x in base.split("-", 1))
        else:
            a = b = _number(base)
        n = _number(step) if step else 1
        if n < 1 or a < lo or b > hi or a > b:
            raise ValueError(part)
        out.update(range(a, b + 1, n))
    return out


def next_run(schedule: str, after: float, days: int = 5 * 366) -> Optional[float]:
    """The first time after `after` (epoch seconds) that cron starts an entry with these five
    fields, in this host's local time as cron reads them; None for fields cron would not read
    or that match no day within `days`. As in Vixie cron, a restricted day of month and day of
    week match either one; when either starts with `*`, both must match."""
    fields = schedule.split()
    if len(fields) != 5:
        return None
    try:
        minutes, hours, mdays, months, wdays = (sorted(_field(fields[i], *RANGES[i])) for i in range(5))
    except ValueError:
        return None
    wday_set = {0 if d == 7 else d for d in wdays}
    either = not (fields[2].startswith("*") or fields[4].startswith("*"))
    t = time.localtime(after)
    day = datetime.date(t.tm_year, t.tm_mon, t.tm_mday)
    for _ in range(days):
        in_mday, in_wday = day.day in mdays, (day.weekday() + 1) % 7 in wday_set
        if day.month in months and ((in_mday or in_wday) if either else (in_mday and in_wday)):
            for h in hours:
                for m in minutes:
                    at = time.mktime((day.year, day.month, day.day, h, m, 0, 0, 0, -1))
                    if at > after:
                        return at
        day += datetime.timedelta(days=1)
    return None


def _stat_key(path: str) -> Tuple[int, int]:
    st = os.stat(path)
    return (st.st_dev, st.st_ino)


def cron_daemons(proc: str = "/proc") -> List[int]:
    """The pids of cron daemons that read this host's /etc/cron.d. A cron seen in /proc but
    living under another root or mount namespace (a container, another simulated host) reads
    another /etc/cron.d and runs none of these jobs; one whose root cannot be looked into (not
    root here) is counted, as nothing says it is elsewhere."""
    try:
        here: Optional[Tuple[int, int]] = _stat_key(CRON_DIR)
    except OSError:
        here = None
    found: List[int] = []
    try:
        entries = os.listdir(proc)
    except OSError:
        return found
    for entry in entries:
        if not (entry.isascii() and entry.isdigit()):
            continue
        comm = _read(f"{proc}/{entry}/comm")
        stat = _read(f"{proc}/{entry}/stat")
        if comm is None or comm.strip() not in CRON_DAEMONS or stat is None:
            continue
        if stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]:
            continue  # exited, not yet reaped
        try:
            there: Optional[Tuple[int, int]] = _stat_key(f"{proc}/{entry}/root{CRON_DIR}")
        except PermissionError:
            there = here
        except OSError:
            continue
        if there == here:
            found.append(int(entry))
    return sorted(found)


def daemons() -> Dict[str, Any]:
    """What runs labctl's jobs here: cron daemons (pids) for cron.d files, systemd for timers."""
    return {"cron": cron_daemons(), "systemd": os.path.isdir("/run/systemd/system")}


@command(
    takes={},
    answers={
        "jobs": [
            {
                "name": "str",
                "backend?": "str?",
                "schedule?": "str?",
                "last?": ({"rc?": "int?", "end?": "time?"}, "null"),
                "next?": "time?",
                "daemon_running?": "bool",
            }
        ],
        "daemons?": {"cron?": ["int"], "systemd?": "bool"},
        "time?": "time",
    },
)
def list_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """args: {} -> {"jobs": [{name, backend, file, schedule, command, user, line, last, next,
    daemon_running}], "daemons": {"cron": [pid], "systemd": bool}, "time": now}."""
    now = time.time()
    running = daemons()
    jobs: List[Dict[str, Any]] = []
    found = [("cron", p) for p in glob.glob(CRON_DIR + "/labctl-*")]
    found += [("systemd", p) for p in glob.glob(UNIT_DIR + "/labctl-*.service")]
    for backend, path in sorted(found, key=lambda bp: bp[1]):
        text = _read(path)
        if text is None or "# labctl:cron:" not in text:
            continue  # a file someone else named labctl-*: not ours to report
        job = parse_job_file(text)
        name = job.get("name") or os.path.basename(path)[len("labctl-") :].split(".")[0]
        job.update(name=name, backend=backend, file=path, last=last_run(name))
        job["daemon_running"] = bool(running["systemd"] if backend == "systemd" else running["cron"])
        job["next"] = next_run(str(job.get("schedule") or ""), now)
        jobs.append(job)
    return {"jobs": jobs, "daemons": running, "time": now}
