"""A cloud session's launcher: the code that runs on Kaggle or SageMaker, not on the controller.

`bundle.session_source` copies this module's text into the Kaggle script (with the trainer
zip embedded, since Kaggle pushes the code file alone) and into SageMaker's source tarball
as its entry point, followed by the session's CONFIG. Standard library only, Python 3.8
syntax: it runs on the platform's own interpreter, next to its torch.

What it does, in order: find the checkpoint folder (Kaggle: /kaggle/working/..., copying a
previous session's checkpoints from /kaggle/input/SLUG/... first; SageMaker: /opt/ml/checkpoints,
which SageMaker fills from S3 itself), give the trainer what is left of the session's time
as `time_limit`, run it, and exit with its status. LABCTL_KAGGLE_ROOT / LABCTL_SAGEMAKER_ROOT
replace /kaggle and /opt/ml, so the same file runs on any machine with torch.
"""

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from typing import Any, Optional

EXIT_INPUT = 2
ROOT_ENV = {"kaggle": ("LABCTL_KAGGLE_ROOT", "/kaggle"), "sagemaker": ("LABCTL_SAGEMAKER_ROOT", "/opt/ml")}
BUNDLE_B64 = ""  # Kaggle: the trainer zip, filled in by labctl


def say(text: str) -> None:
    print("labctl session: " + text, flush=True)


def root_of(platform: str) -> str:
    env, default = ROOT_ENV[platform]
    return os.environ.get(env) or default


def find_previous(input_dir: str, slug: str, subdir: str) -> Optional[str]:
    """The previous session's checkpoint folder among the attached inputs, or None.

    Kaggle mounts a kernel source at /kaggle/input/SLUG; some images nest it a level or two
    deeper, so those are looked at too.
    """
    direct = os.path.join(input_dir, slug, subdir)
    if os.path.isdir(direct):
        return direct
    for top, dirs, _ in os.walk(input_dir):
        if os.path.basename(top) == slug and os.path.isdir(os.path.join(top, subdir)):
            return os.path.join(top, subdir)
        if top[len(input_dir) :].count(os.sep) >= 3:
            dirs[:] = []
    return None


def copy_previous(src: str, dst: str) -> list[str]:
    """Copy the previous session's checkpoint files that `dst` lacks; the names copied."""
    copied = []
    for name in sorted(os.listdir(src)):
        source = os.path.join(src, name)
        target = os.path.join(dst, name)
        # A name starting with a dot is a write the previous session did not finish.
        if not name.startswith(".") and os.path.isfile(source) and not os.path.exists(target):
            tmp = os.path.join(dst, "." + name + ".copying")
            shutil.copyfile(source, tmp)
            os.replace(tmp, target)  # a session cut off mid-copy leaves no half file under the real name
            copied.append(name)
    return copied


def unpack_bundle(config: dict[str, Any], here: str) -> str:
    """The trainer zip's path: decoded from BUNDLE_B64 (Kaggle), else the file beside this one."""
    name = config["bundle_name"]
    if BUNDLE_B64:
        data = base64.b64decode(BUNDLE_B64)
        path = os.path.join(tempfile.mkdtemp(prefix="labctl-"), name)
        with open(path, "wb") as f:
            f.write(data)
    else:
        path = os.path.join(here, name)
        with open(path, "rb") as f:
            data = f.read()
    if hashlib.sha256(data).hexdigest() != config["bundle_sha256"]:
        raise SystemExit(
            "labctl session: " + name + " is damaged (its SHA-256 differs); write the session again"
        )
    return path


def from_hyperparameters(path: str) -> tuple[dict[str, Any], int]:
    """SageMaker: the trainer's settings and time limit, as the request's HyperParameters give them."""
    with open(path) as f:
        hp = json.load(f)
    settings = hp["labctl_settings"]
    return (json.loads(settings) if isinstance(settings, str) else settings), int(hp["labctl_time_limit_s"])


def launcher(environ: Mapping[str, str]) -> list[str]:
    """torchrun's arguments when SageMaker gives the job several GPUs or instances, else none."""
    hosts = json.loads(environ.get("SM_HOSTS") or "[]")
    gpus = int(environ.get("SM_NUM_GPUS") or "0")
    if len(hosts) <= 1 and gpus <= 1:
        return []
    return [
        "-m",
        "torch.distributed.run",
        "--nnodes=" + str(max(1, len(hosts))),
        "--node-rank=" + str(hosts.index(environ["SM_CURRENT_HOST"]) if hosts else 0),
        "--nproc-per-node=" + str(max(1, gpus)),
        "--master-addr=" + (hosts[0] if hosts else "127.0.0.1"),
        "--master-port=29500",
    ]


def paths_for(config: dict[str, Any]) -> dict[str, str]:
    root = root_of(config["platform"])
    if config["platform"] == "kaggle":
        work = os.path.join(root, "working")
        return {
            "work": work,
            "checkpoints": os.path.join(work, config["checkpoint_subdir"]),
            "input": os.path.join(root, "input"),
            "metrics": os.path.join(work, "labctl-runs", config["run_id"], "metrics.jsonl"),
        }
    return {
        "work": os.path.join(root, "model"),  # SageMaker uploads it as model.tar.gz at the end
        "checkpoints": os.path.join(root, "checkpoints"),  # synced with CheckpointConfig.S3Uri
        "input": os.path.join(root, "input"),
        "metrics": os.path.join(root, "model", "metrics.jsonl"),
    }


def main(config: dict[str, Any], here: str) -> int:
    started = time.monotonic()
    where = paths_for(config)
    ckpt = where["checkpoints"]
    os.makedirs(ckpt, exist_ok=True)
    os.makedirs(os.path.dirname(where["metrics"]), exist_ok=True)
    slug = config.get("resume_from")
    if slug:
        src = find_previous(where["input"], slug.split("/")[-1], config["checkpoint_subdir"])
        if src is None:
            found = sorted(os.listdir(where["input"])) if os.path.isdir(where["input"]) else []
            say(
                "error: no checkpoints of "
                + slug
                + " under "
                + where["input"]
                + " (it holds: "
                + (", ".join(found) or "nothing")
                + "). Attach that kernel's output "
                "(kernel_sources in kernel-metadata.json) and run again; nothing was trained."
            )
            return EXIT_INPUT
        copied = copy_previous(src, ckpt)
        say("resuming from " + src + ": copied " + (", ".join(copied) or "nothing new"))
    existing = sorted(n for n in os.listdir(ckpt) if n.startswith("step-"))
    if existing:
        say("checkpoints in " + ckpt + ": " + ", ".join(existing))
    settings, limit = config["settings"], config["time_limit_s"]
    if config["platform"] == "sagemaker":
        settings, limit = from_hyperparameters(os.path.join(where["input"], "config", "hyperparameters.json"))
    left = max(1, int(limit - (time.monotonic() - started)))
    env = dict(os.environ)
    env["LABCTL_TIME_LIMIT_S"] = str(left)
    env["LABCTL_CHECKPOINT_DIR"] = ckpt
    env.setdefault("LABCTL_RUN_ID", config["run_id"])
    script = config.get("script")
    if script:
        path = os.path.join(here, script["name"])
        if script.get("b64"):
            path = os.path.join(tempfile.mkdtemp(prefix="labctl-"), script["name"])
            with open(path, "wb") as f:
                f.write(base64.b64decode(script["b64"]))
        argv = [path, *list(script["args"])]
    else:
        bundle = unpack_bundle(config, here)
        settings = dict(settings)
        settings.update(checkpoint_dir=ckpt, metrics_path=where["metrics"], time_limit=left)
        settings_path = os.path.join(where["work"], "labctl-settings.json")
        with open(settings_path, "w") as f:
            json.dump(settings, f, indent=1, sort_keys=True)
        env["PYTHONPATH"] = bundle + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        argv = ["-m", "labctl.agent.train.trainer", "--settings", "@" + settings_path]
    argv = [sys.executable, *launcher(os.environ), *argv]
    say(
        "run "
        + config["run_id"]
        + ", phase "
        + str(config["phase"])
        + ": time limit "
        + str(left)
        + " s, checkpoints in "
        + ckpt
    )
    rc = subprocess.call(argv, env=env, cwd=where["work"])
    # The trainer's "time limit reached, resumable" (labctl.agent.train.settings.EXIT_PAUSED),
    # which CONFIG carries: this file runs where labctl is not installed.
    if rc == config["trainer_paused_exit"]:
        say("time limit reached: the checkpoints in " + ckpt + " resume the run in the next session")
        return int(config["paused_exit"])
    # Under torchrun a paused trainer exits 0 too: its last event says whether it finished or paused.
    say("the training ended (exit 0)" if rc == 0 else "the training failed (exit " + str(rc) + ")")
    return rc
