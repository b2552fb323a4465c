"""Where labctl keeps its own files on a host: the one place both sides read it from.

The controller imports this module to name paths in plans, job files and messages; the agent
imports it to read and write them. Root's files live under /var/lib/labctl (a path the
simulated lab mounts privately per host); another user cannot write there, so theirs live
under ~/.cache/labctl. Standard library only, Python 3.8, like the rest of the agent.
"""

from __future__ import annotations

import os

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
# growing per hour) can be judged from one call; history.lock serialises writers.
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
# labctl installed on the orchestrator for its scheduled jobs (lib/, bin/labctl) and its lab copy
# (lab/: inventory, keys, playbooks), so a job runs with no laptop and no venv.
CONTROLLER_DIR = HOME + "/controller"
# Sandbox image builds: temp root filesystems (build/), debootstrap's .deb cache (debs/), locks.
SANDBOX_DIR = HOME + "/sandbox"
DOCKERD_LOG = LOG_DIR + "/dockerd.log"  # dockerd started by labctl where systemd does not run

# The sandbox pool's claim lock and its record of which agent process holds each claimed
# container: beside the Docker socket in /run, which every agent on one dockerd shares (the
# simulated hosts too), and emptied by a reboot, like the containers it describes.
SANDBOX_RUN_DIR = "/run/lock/labctl-sandbox"

# labctl's metadata folder inside a model cache and a storage host's model library.
CACHE_META = ".labctl"


def home_for(root: bool) -> str:
    """labctl's folder for a user on a host: absolute for root, relative to the home otherwise."""
    return HOME if root else USER_HOME


def agent_dir(root: bool) -> str:
    return home_for(root) + "/agent"


def runs_dir(root: bool, run_id: str) -> str:
    """Where a training run's per-rank logs and exit codes live on a host."""
    return home_for(root) + "/runs/" + run_id


def local_home() -> str:
    """labctl's folder for whoever runs this process, as an absolute path."""
    if os.geteuid() == 0:
        return HOME
    return os.path.join(os.path.expanduser("~"), USER_HOME)


def job_status(name: str) -> str:
    """Where a scheduled job's wrapper records its last run: "RC START END" (epoch seconds)."""
    return LOCK_DIR + "/" + name + ".last"


def status_history() -> str:
    """STATUS_HISTORY for whoever runs this process (root's, else under the user's home)."""
    return local_home() + "/status/history.jsonl"


def provision_lock() -> str:
    """The flock file a changing `labctl provision` run holds on this host (see labctl/hostlock.py)."""
    return local_home() + "/provision.lock"


def torch_probe_dir() -> str:
    return local_home() + "/cache/torch-probe"
