"""The trainer bundle a cloud session carries, and the launcher file that runs it there.

With the reference trainer the bundle is the agent zipapp (the trainer and its modules,
standard library apart from torch), the same bytes `--backend slurm` writes beside its batch
script. With `--script` it is the user's script. Kaggle pushes one code file only, so its
launcher carries the bundle inside itself in base64; SageMaker's launcher finds it beside
itself in the source tarball.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import tarfile
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.agent.train.settings import EXIT_PAUSED
from labctl.output.errors import InputError

ENTRY_TAIL = """

CONFIG = json.loads({config})

if __name__ == "__main__":
    sys.exit(main(CONFIG, os.path.dirname(os.path.abspath(globals().get("__file__") or "."))))
"""


@dataclass(frozen=True)
class Bundle:
    name: str  # file name in the session (labctl-agent-SHA.pyz, or the user's script's name)
    data: bytes
    script_args: tuple[str, ...] = ()
    is_script: bool = False

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def trainer_bundle(script: Path | None, script_args: tuple[str, ...] = ()) -> Bundle:
    """The user's script when one is given, else the agent zipapp holding the reference trainer."""
    if script is not None:
        try:
            return Bundle(script.name, script.read_bytes(), script_args, is_script=True)
        except OSError as exc:
            raise InputError(f"Cannot read {script}: {exc.strerror}.", "Give a readable script.") from None
    from labctl.hosts.agent_ship import agent_zip

    data, short = agent_zip()
    return Bundle(f"labctl-agent-{short}.pyz", data)


def session_config(
    *,
    platform: str,
    run_id: str,
    phase: int,
    settings: dict[str, Any],
    time_limit_s: int,
    bundle: Bundle,
    paused_exit: int,
    checkpoint_subdir: str,
    resume_from: str | None = None,
    embed: bool = False,
) -> dict[str, Any]:
    """What the launcher (cloud/session.py) reads: one JSON object at the end of its file."""
    config: dict[str, Any] = {
        "platform": platform,
        "run_id": run_id,
        "phase": phase,
        "settings": settings,
        "time_limit_s": time_limit_s,
        "checkpoint_subdir": checkpoint_subdir,
        "resume_from": resume_from,
        "paused_exit": paused_exit,
        "trainer_paused_exit": EXIT_PAUSED,
        "bundle_name": bundle.name,
        "bundle_sha256": bundle.sha256,
        "script": None,
    }
    if bundle.is_script:
        config["script"] = {"name": bundle.name, "args": list(bundle.script_args)}
        if embed:
            config["script"]["b64"] = base64.b64encode(bundle.data).decode()
    return config


def session_source(config: dict[str, Any], header: list[str], embed: Bundle | None = None) -> str:
    """The launcher as one file: a comment header, cloud/session.py, the embedded zip if any, CONFIG."""
    source = (Path(__file__).parent / "session.py").read_text()
    parts = ["#!/usr/bin/env python3\n", *(f"# {line}\n" for line in header), source]
    if embed is not None and not embed.is_script:
        wrapped = "\n".join(textwrap.wrap(base64.b64encode(embed.data).decode(), 100))
        parts.append(
            f'\n# {embed.name}, the trainer, in base64 (SHA-256 {embed.sha256}).\nBUNDLE_B64 = """\n{wrapped}\n"""\n'
        )
    text = json.dumps(config, sort_keys=True)
    parts.append(ENTRY_TAIL.format(config=repr(text)))
    return "".join(parts)


def tarball(members: dict[str, bytes]) -> bytes:
    """A gzipped tar of `members` (name -> bytes), the same bytes for the same input."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size = len(members[name])
            info.mode = 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(members[name]))
    return gzip.compress(buf.getvalue(), mtime=0)
