"""A Kubernetes pod's container, run on this machine as the kubelet would start it.

The kubelet expands `$(VAR)` in a container's command and env from the env before it
(`$$` is a literal `$`), puts what the operator adds (PET_* for torchrun) beside it, and
starts the command in the image. Here the image is this interpreter and each volume is a
local folder; everything else is the manifest's own. Shared by the PyTorchJob and TrainJob tests.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of command and env values (kubernetes third_party expansion):
    `$$` is a literal `$`, `$(NAME)` is NAME's value when NAME is defined."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
            elif nxt == "(" and ")" in text[i + 2 :]:
                end = text.index(")", i + 2)
                name = text[i + 2 : end]
                out.append(env.get(name, f"$({name})"))
                i = end + 1
                continue
            else:
                out.append("$" + nxt)
            i += 2
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def container_env(container: dict[str, Any], injected: dict[str, str]) -> dict[str, str]:
    """The container's environment: the manifest's env, expanded in order, over what is injected."""
    env = dict(injected)
    for item in container.get("env", []):
        env[item["name"]] = k8s_expand(item["value"], env)
    return env


def start(
    container: dict[str, Any], injected: dict[str, str], cwd: Path, folders: dict[str, Path]
) -> subprocess.Popen[str]:
    """Start the container's command with this interpreter as the image's python.

    `folders` maps a path in the pod (a volume's mountPath) to the local folder standing in for it:
    every env value and argument under it is rewritten to the folder.
    """

    def local(text: str) -> str:
        for pod_path, folder in sorted(folders.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(pod_path + "/", f"{folder}/")
            if text == pod_path:
                text = str(folder)
        return text

    env = {k: local(v) for k, v in container_env(container, injected).items()}
    argv = [local(k8s_expand(a, env)) for a in container["command"]]
    assert argv[0].startswith("python"), argv  # the image's interpreter
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return subprocess.Popen(
        [sys.executable, *argv[1:]],
        cwd=cwd,
        env={**keep, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def kill(pod: subprocess.Popen[str]) -> None:
    """SIGKILL the container's every process, as when its node goes away.

    torchrun starts each worker in a session of its own, so killing torchrun's process group
    would leave the workers training on; the pod's processes are torchrun's descendants.
    """
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree, grew = {pod.pid}, True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= more
        grew = bool(more)
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def events(path: Path) -> list[dict[str, Any]]:
    """The trainer's metrics events so far (none before the file exists). A line still being
    written (no newline yet) is not one."""
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def configmap_folder(configmap: dict[str, Any], folder: Path) -> Path:
    """A ConfigMap volume as the kubelet lays it out: one file per key."""
    folder.mkdir()
    for key, b64 in configmap.get("binaryData", {}).items():
        (folder / key).write_bytes(base64.b64decode(b64))
    return folder


def train_kill_resume(
    container: dict[str, Any],
    injected: dict[str, str],
    cwd: Path,
    folders: dict[str, Path],
    metrics: Path,
    last_step: int,
) -> None:
    """Start the pod, SIGKILL it once a checkpoint is on the claim, start it again: the second run
    resumes from that checkpoint or a later one, trains only past it, and reaches `last_step`."""
    pod = start(container, injected, cwd, folders)
    try:
        deadline = time.monotonic() + 120
        while not any(e["event"] == "checkpoint" for e in events(metrics)) and pod.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint in 120 s"
            time.sleep(0.02)
    finally:
        kill(pod)  # the node goes away: no time to save anything more
        output = pod.communicate()[0]
    first = events(metrics)
    assert not any(e["event"] == "done" for e in first), output
    saved = max(e["step"] for e in first if e["event"] == "checkpoint")
    again = start(container, injected, cwd, folders)
    output = again.communicate(timeout=180)[0]
    assert again.returncode == 0, output
    second = events(metrics)[len(first) :]
    [start_event] = [e for e in second if e["event"] == "start"]
    assert start_event["resumed_from"] is not None and start_event["resumed_from"] >= saved
    steps = [e["step"] for e in second if e["event"] == "step"]
    assert steps and min(steps) > start_event["resumed_from"]
    assert second[-1]["event"] == "done" and second[-1]["step"] == last_step
