"""Host side of `labctl cron list`: labctl's scheduled jobs on this host and their last run.

A job is a marked /etc/cron.d/labctl-NAME file, or a labctl-NAME.service + .timer pair where
systemd runs (both written by the `cron` provision resource). Their `# labctl:` comment lines
say the schedule and command as given; the wrapper records each run's exit code and end time
in paths.job_status(NAME). Standard library only, Python 3.8.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any, Dict, List, Optional

from . import paths

CRON_DIR = "/etc/cron.d"
UNIT_DIR = "/etc/systemd/system"
MARK_RE = re.compile(r"^# labctl:(cron|schedule|command):\s?(.*)$")


def parse_job_file(text: str) -> Dict[str, Any]:
    """The marks of one job file, and for a cron.d file its entry: the schedule, the user and
    the shell line cron runs (its `\\%` escapes undone, as cron undoes them)."""
    out: Dict[str, Any] = {}
    for line in text.splitlines():
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
        fields = line.split(None, 6)
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
    text = _read(paths.job_status(name))
    if text is None:
        return None
    parts = text.split()
    try:
        return {"rc": int(parts[0]), "end": int(parts[1])}
    except (IndexError, ValueError):
        return {"rc": None, "end": None, "error": f"unreadable: {text[:80]!r}"}


def list_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """args: {} -> {"jobs": [{name, backend, file, schedule, command, user, line, last}]}."""
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
        jobs.append(job)
    return {"jobs": jobs}
