"""Where labctl keeps its own files on a host: the one place both sides read it from.

The controller imports this module to name paths in plans, job files and messages; the agent
imports it to read and write them. Root's files live under /var/lib/labctl (a path the
simulated lab mounts privately per host); another user cannot write there, so theirs live
under ~/.cache/labctl. Standard library only, Python 3.8, like the rest of the agent.
"""

from __future__ import annotations

import os
import unicodedata
from typing import Any, Optional

HOME = "/var/lib/labctl"
# Relative on purpose: an SSH session starts in the user's home, so the agent can be found
# there without knowing what that home is.
USER_HOME = ".cache/labctl"
LOG_DIR = "/var/log/labctl"

ENVS_DIR = HOME + "/envs"  # torch_env's virtualenvs
TORCH_ENV_RECORD = ENVS_DIR + "/torch.json"  # what torch_env last verified; facts report it
BACKUP_DIR = HOME + "/backup"  # old copies of system files labctl rewrote, kept out of /etc
FSTAB_BACKUP = BACKUP_DIR + "/fstab"
LOCK_DIR = HOME + "/locks"  # flock files of scheduled jobs
TRAIN_DIR = HOME + "/train"  # default parent of checkpoint folders
# `labctl status` samples (host memory, GPU memory and utilisation), one JSON line each, kept
# 2 h on the host so alerts that need a duration (GPU memory full for 5 minutes, host memory
# growing per hour) can be judged from one call; history.lock serialises writers. cpu.json beside
# it: the last call's /proc/stat reading, so the next one need not sleep for busy %.
STATUS_DIR = HOME + "/status"
STATUS_HISTORY = STATUS_DIR + "/history.jsonl"
# Network transactions: `current` names the open one; each has a folder with its record, the
# snapshot and config files from before the change, and its keeper's log.
NET_DIR = HOME + "/net"
ORCHESTRA_DIR = HOME + "/orchestra"
WARM_STATE = ORCHESTRA_DIR + "/warm.json"  # the warm set the rotation loaded; phase 3 needs it
ORCHESTRA_HISTORY = ORCHESTRA_DIR + "/history.jsonl"  # one line per committed rotation, newest last
ORCHESTRA_LOCK = ORCHESTRA_DIR + "/rotate.lock"  # host_lock's file while a rotation changes this host
ORCHESTRA_LOGS = ORCHESTRA_DIR + "/logs"  # MODEL.log: each model server's output, appended per start
# On the hosts that train: the models to ask now, rewritten by every rotation (the trainer's
# client reads it per batch of calls). Addresses and variable names only, never a key.
ORCHESTRA_ENDPOINTS = ORCHESTRA_DIR + "/endpoints.json"
# labctl installed on the orchestrator for its scheduled jobs (lib/, bin/labctl) and its lab copy
# (lab/: inventory, keys, playbooks), so a job runs with no laptop and no venv.
CONTROLLER_DIR = HOME + "/controller"
# Sandbox image builds: temp root filesystems (build/), debootstrap's .deb cache (debs/), locks.
SANDBOX_DIR = HOME + "/sandbox"
# `labctl sandbox serve`: on the sandbox host, the service's token (0600, made once), the
# config it runs with, its log; on each training host, where the service is (client.json,
# 0644) and the same token (client-token, 0600), which the trainer's client reads.
SANDBOX_TOKEN = SANDBOX_DIR + "/service-token"
SANDBOX_SERVICE_CONFIG = SANDBOX_DIR + "/service.json"
SANDBOX_SERVICE_LOG = SANDBOX_DIR + "/service.log"
SANDBOX_CLIENT = SANDBOX_DIR + "/client.json"
SANDBOX_CLIENT_TOKEN = SANDBOX_DIR + "/client-token"
DOCKERD_LOG = LOG_DIR + "/dockerd.log"  # dockerd started by labctl where systemd does not run

# The sandbox pool's claim lock and its record of which agent process holds each claimed
# container: beside the Docker socket in /run, which every agent on one dockerd shares (the
# simulated hosts too), and emptied by a reboot, like the containers it describes.
SANDBOX_RUN_DIR = "/run/lock/labctl-sandbox"

# labctl's metadata folder inside a model cache and a storage host's model library.
CACHE_META = ".labctl"


# The longest file name Linux file systems take (NAME_MAX), in bytes.
NAME_MAX = 255


def char_problem(text: str) -> Optional[str]:
    """The first character of `text` that no name or path of labctl's may hold, described, or
    None. Control characters (C0, DEL, C1), line and paragraph separators, spaces other than
    ' ' and invisible format characters: Python's splitlines() and split() cut at several of
    them where fstab, cron and the shell do not, and the rest make two names look alike."""
    for c in text:
        category = unicodedata.category(c)
        if category == "Cc":
            return f"a control character ({c!r})"
        if category == "Cs":
            return f"a lone surrogate (U+{ord(c):04X}: bytes that are not UTF-8)"
        if c != " " and category in ("Zs", "Zl", "Zp", "Cf"):
            return f"an invisible or line-breaking character (U+{ord(c):04X} {unicodedata.name(c, '')})"
    return None


def component_problem(name: Any) -> Optional[str]:
    """Why `name` cannot be one path component that labctl joins under a folder of its own (a
    model, run, job, log, sandbox language ...), or None when it can. The one rule, on both
    sides: the controller refuses such a name as bad input before anything runs
    (labctl/documents/validation.py path_component), and the agent refuses it again where it joins the
    name into a path (`child`), whoever sent it."""
    if not isinstance(name, str) or not name:
        return "it is empty"
    if name in (".", ".."):
        return "it names a folder itself, not a name inside it"
    if "/" in name or "\\" in name:
        return "it has a path separator ('/' or '\\'), which would make it several folders"
    odd = char_problem(name)
    if odd:
        return f"it has {odd}"
    if len(name.encode("utf-8", "surrogatepass")) > NAME_MAX:
        return f"it is longer than {NAME_MAX} bytes, the most a file name can be"
    return None


def child(folder: str, name: str, what: str) -> str:
    """`folder/name` for a `name` that is one path component; ValueError naming `what` otherwise."""
    problem = component_problem(name)
    if problem:
        raise ValueError(f"{what} {name!r} is not a single name: {problem}")
    return folder.rstrip("/") + "/" + name


def home_for(root: bool) -> str:
    """labctl's folder for a user on a host: absolute for root, relative to the home otherwise."""
    return HOME if root else USER_HOME


def agent_dir(root: bool) -> str:
    return home_for(root) + "/agent"


def runs_dir(root: bool, run_id: str) -> str:
    """Where a training run's per-rank logs and exit codes live on a host."""
    return child(home_for(root) + "/runs", run_id, "the run id")


def local_home() -> str:
    """labctl's folder for whoever runs this process, as an absolute path."""
    if os.geteuid() == 0:
        return HOME
    return os.path.join(os.path.expanduser("~"), USER_HOME)


def job_status(name: str) -> str:
    """Where a scheduled job's wrapper records its last run: "RC START END" (epoch seconds)."""
    return child(LOCK_DIR, name, "the job name") + ".last"


def status_history() -> str:
    """STATUS_HISTORY for whoever runs this process (root's, else under the user's home)."""
    return local_home() + "/status/history.jsonl"


def provision_lock() -> str:
    """The flock file a changing `labctl provision` run holds on this host (see labctl/hosts/hostlock.py)."""
    return local_home() + "/provision.lock"


def torch_probe_dir() -> str:
    return local_home() + "/cache/torch-probe"


def remote_spend_dir() -> str:
    """Where a host that trains keeps its remote tiers' spend (agent/orchestra/spend.py): under
    the home of whoever runs the trainer, which is also who answers `monitor.status` there."""
    return local_home() + "/orchestra/spend"
