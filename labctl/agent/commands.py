"""The agent's command table: name -> handler(args: dict) -> dict.

A handler is either a callable or a "module:function" string relative to this package; the
string form is imported only when that command runs, so a heavy or broken module for one
command (bench, load) never slows down or breaks another (ping, facts). What each command
answers is declared in answers.py: the controller refuses an answer of another shape.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
import time
from typing import Any, Callable, Dict, Union

from . import AGENT_VERSION

Handler = Callable[[Dict[str, Any]], Dict[str, Any]]


class AgentError(Exception):
    """A failure the handler can name: `kind` is a short machine-readable word."""

    def __init__(self, message: str, kind: str = "failed") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


def ping(args: Dict[str, Any]) -> Dict[str, Any]:
    return {
        "agent_version": AGENT_VERSION,
        "python_version": platform.python_version(),
        "python": sys.executable,
        "pid": os.getpid(),
        # Read against the controller's clock around the call: `labctl doctor`'s clock skew.
        "time": time.time(),
    }


COMMANDS: Dict[str, Union[str, Handler]] = {
    "ping": ping,
    "facts": ".facts:facts_command",
    "probe": ".provision:probe_command",
    "apply": ".provision:apply_command",
    "host_lock": ".hostlock:lock_command",
    "cron_list": ".cronjobs:list_command",
    "cache_state": ".cache.manifest:state_command",
    "cache_list": ".cache.serve:list_command",
    "cache_serve": ".cache.serve:serve_command",
    "cache_pull": ".cache.pull:pull_command",
    "cache_evict": ".cache.manifest:evict_command",
    "cache_pin": ".cache.manifest:pin_command",
    "cache_touch": ".cache.manifest:touch_command",
    "cache_verify": ".cache.verify:verify_command",
    "read_cold": ".load_stages:read_cold_command",
    "load_stages": ".load_stages:load_stages_command",
    "make_model": ".modelgen:make_model_command",
    "train_preflight": ".train_host:preflight_command",
    "train_spawn": ".train_host:spawn_command",
    "train_ps": ".train_host:ps_command",
    "train_status": ".train_host:status_command",
    "orch_state": ".orchestra.host:state_command",
    "orch_start": ".orchestra.host:start_command",
    "orch_health": ".orchestra.host:health_command",
    "orch_stop": ".orchestra.host:stop_command",
    "orch_commit": ".orchestra.host:commit_command",
    "net_begin": ".net.txn:begin_command",
    "net_status": ".net.txn:status_command",
    "net_commit": ".net.txn:commit_command",
    "net_abort": ".net.txn:abort_command",
    "sandbox_images": ".sandbox.image:images_command",
    "sandbox_build": ".sandbox.image:build_command",
    "sandbox_run": ".sandbox.runner:run_command",
    "sandbox_bench": ".sandbox.runner:bench_command",
    "sandbox_hostcheck": ".sandbox.hostcheck:hostcheck_command",
    "net_sink": ".netbench:sink_command",
    "net_send": ".netbench:send_command",
    "status": ".status:status_command",
    "ckpt_newest": ".ckpt_lib_cmds:newest_command",
    "ckpt_lib_list": ".ckpt_lib_cmds:list_command",
    "ckpt_lib_commit": ".ckpt_lib_cmds:commit_command",
    "ckpt_lib_remove": ".ckpt_lib_cmds:remove_command",
    "ckpt_lib_verify": ".ckpt_lib_cmds:verify_command",
    "ckpt_restore_commit": ".ckpt_lib_cmds:restore_commit_command",
    "ckpt_pull_state": ".ckpt_pull_host:ckpt_state_command",
    "ckpt_pull_commit": ".ckpt_pull_host:ckpt_commit_command",
    "model_publish_state": ".ckpt_pull_host:model_state_command",
    "model_publish": ".ckpt_pull_host:model_publish_command",
}


def register(name: str, handler: Union[str, Handler]) -> None:
    COMMANDS[name] = handler


def resolve(name: str) -> Handler:
    try:
        entry = COMMANDS[name]
    except KeyError:
        known = ", ".join(sorted(COMMANDS))
        raise AgentError(f"unknown command {name!r}; known: {known}", "unknown_command") from None
    if callable(entry):
        return entry
    module_name, _, attr = entry.partition(":")
    module = importlib.import_module(module_name, __package__)
    handler: Handler = getattr(module, attr)
    return handler
