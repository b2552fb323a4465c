"""`sandbox`: Docker for untrusted code, hardened, with one image per language of the host.

Docker comes from the distribution (`docker.io`); /etc/docker/daemon.json gets log limits,
no-new-privileges and live-restore for every container, and user-namespace remapping where
the kernel allows it (other keys in the file are kept). Remapping moves Docker's storage, so
everything already there drops out of `docker ps` and `docker images`: by default it is turned
on only on a daemon that holds nothing labctl did not create (`userns_remap: force` turns it on
anyway). dockerd runs as docker.service where
systemd is PID 1, else in the background with its pid file and a log under /var/log/labctl,
and is restarted only when daemon.json changed. Each language's image is built from Debian
packages (labctl/agent/sandbox/image.py) and rebuilt only when its recipe's hash changes.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, NamedTuple, Optional

from pydantic import Field, field_validator

from labctl.agent.core import paths
from labctl.agent.sandbox import image_name
from labctl.agent.sandbox.languages import RECIPES, SUITE, recipe_hash
from labctl.inventory.model import Host
from labctl.provision.resource import (
    Change,
    NotApplicable,
    Params,
    PlanError,
    Probes,
    Resource,
    State,
    probe_error,
)
from labctl.provision.resources.files import file_text, plan_file

DAEMON_JSON = "/etc/docker/daemon.json"
DAEMON_JSON_BACKUP = paths.BACKUP_DIR + "/daemon.json"  # the one before labctl's last change
DEFAULT_MIRROR = "http://deb.debian.org/debian"


def check_languages(v: list[str]) -> list[str]:
    unknown = [lang for lang in v if lang not in RECIPES]
    if unknown:
        raise ValueError(
            f"no sandbox language {', '.join(repr(u) for u in unknown)}; known: {', '.join(sorted(RECIPES))}"
        )
    if not v:
        raise ValueError("name at least one language, e.g. languages: [python]")
    return list(dict.fromkeys(v))


class SandboxParams(Params):
    languages: Optional[list[str]] = Field(
        None, description="override the inventory's sandbox.languages, e.g. languages: [python, c]"
    )
    configure_daemon: bool = Field(
        True,
        description="write daemon.json and restart dockerd when it changes (false: use the daemon as it is)",
    )
    log_max_size: str = Field(
        "10m", pattern=r"^[1-9][0-9]*[kmg]$", description="json-file max-size, e.g. 10m"
    )
    log_max_file: int = Field(3, ge=1, le=100, description="json-file max-file")
    userns_remap: Literal["auto", "force", "off"] = Field(
        "auto",
        description="auto: remap container root where the kernel allows it and Docker holds no container "
        "or image labctl did not create (remapping hides them); force: even then; off: never",
    )
    mirror: str = Field(DEFAULT_MIRROR, description="Debian mirror the images are built from")

    @field_validator("languages")
    @classmethod
    def _languages(cls, v: Optional[list[str]]) -> Optional[list[str]]:
        return None if v is None else check_languages(v)

    @field_validator("mirror")
    @classmethod
    def _mirror(cls, v: str) -> str:
        if not re.fullmatch(r"(https?|file)://\S+", v):
            raise ValueError(f"{v!r} is not a mirror URL, e.g. mirror: http://deb.debian.org/debian")
        return v.rstrip("/")


def daemon_settings(p: SandboxParams, userns_on: bool, current: Any = None) -> dict[str, Any]:
    """The keys of daemon.json this resource owns (None: the key must be absent). A remap
    already set is kept as written: another user or range would move the storage again."""
    return {
        "log-driver": "json-file",
        "log-opts": {"max-size": p.log_max_size, "max-file": str(p.log_max_file)},
        "no-new-privileges": True,
        "live-restore": True,
        "userns-remap": (current or "default") if userns_on else None,
    }


def _some(kind: str, names: list[str]) -> str:
    shown = ", ".join(names[:3]) + (f", … {len(names) - 3} more" if len(names) > 3 else "")
    return f"{len(names)} {kind}{'s' if len(names) != 1 else ''} ({shown})"


def held_by_others(foreign: dict[str, Any]) -> str:
    """What the daemon holds that labctl did not create, in words ("" when nothing)."""
    return " and ".join(_some(k, foreign[k + "s"]) for k in ("container", "image") if foreign.get(k + "s"))


class Remap(NamedTuple):
    on: bool
    why: str  # for the plan's summary
    withheld: bool = False  # auto left it off: said even when daemon.json needs no change


def userns_decision(mode: str, userns: dict[str, Any], foreign: dict[str, Any], now: str | None) -> Remap:
    """Whether daemon.json asks for userns-remap, and why; pure. `now`: daemon.json's text.

    Turning it on moves Docker to a new, empty storage: what the daemon holds drops out of
    `docker ps`/`docker images`. `auto` turns it on only when none of that is someone else's
    (`foreign`, from the probe); a remap already on stays on."""
    if mode == "off":
        return Remap(False, "userns-remap off as the playbook says")
    if not userns.get("ok"):
        return Remap(False, f"userns-remap skipped: {userns.get('why') or 'not supported here'}")
    if _userns_of(now):
        return Remap(True, "userns-remap")
    held = "" if foreign.get("error") else held_by_others(foreign)
    if mode == "force":
        if held:
            return Remap(
                True,
                f"userns-remap, as the playbook forces: Docker's {held} stay in the storage it leaves "
                "and are not listed while it is on",
            )
        return Remap(True, "userns-remap")
    if foreign.get("error"):
        return Remap(
            False,
            f"userns-remap left off: cannot tell what Docker holds ({foreign['error']}); "
            "userns_remap: force turns it on",
            withheld=True,
        )
    if held:
        return Remap(
            False,
            f"userns-remap left off: Docker holds {held} that labctl did not create, which remapping "
            "would hide from docker ps and docker images; userns_remap: force turns it on anyway",
            withheld=True,
        )
    return Remap(True, "userns-remap")


def merged_daemon_json(text: str | None, settings: dict[str, Any]) -> str:
    """daemon.json with `settings` applied and every other key kept (log-opts merged key by key)."""
    doc: dict[str, Any] = json.loads(text) if text and text.strip() else {}
    if not isinstance(doc, dict):
        raise ValueError("it is not a JSON object")
    for k, v in settings.items():
        if v is None:
            doc.pop(k, None)
        elif isinstance(v, dict) and isinstance(doc.get(k), dict):
            doc[k] = {**doc[k], **v}
        else:
            doc[k] = v
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _userns_of(text: str | None) -> Any:
    try:
        doc = json.loads(text) if text and text.strip() else {}
    except ValueError:
        return None
    return doc.get("userns-remap") if isinstance(doc, dict) else None


class Sandbox(Resource):
    type_name = "sandbox"
    params_model = SandboxParams
    description = "Docker (docker.io) hardened, running, with one sandbox image per language"
    params: SandboxParams

    @classmethod
    def from_playbook(cls, host: Host, raw: dict[str, Any]) -> Resource:
        params = SandboxParams.model_validate(raw)
        if params.languages is None:
            if host.sandbox is None:
                raise NotApplicable("no sandbox in the inventory for this host")
            params.languages = check_languages(host.sandbox.languages)
        return cls(host, params)

    @property
    def languages(self) -> list[str]:
        return list(self.params.languages or [])

    def label(self) -> str:
        return f"sandbox {','.join(self.languages)}"

    def probes(self) -> Probes:
        return {"docker": {"kind": "sandbox"}}

    def plan(self, state: State) -> Change:
        if probe_error(state, "docker"):
            raise PlanError(
                f"cannot read Docker's state on {self.host.name}: {probe_error(state, 'docker')}."
            )
        st = state["docker"]
        p = self.params
        if st.get("uid") != 0:
            raise PlanError(
                f"the sandbox resource needs root on {self.host.name} (apt, dockerd, debootstrap).",
                "Connect as root: set user: root for this host in the inventory.",
            )
        change = Change()
        missing = [
            pkg
            for pkg, present in (
                ("docker.io", st.get("dockerd") and st.get("docker")),
                ("debootstrap", st.get("debootstrap")),
            )
            if not present
        ]
        if missing and not st.get("apt"):
            raise PlanError(
                f"{self.host.name} lacks {', '.join(missing)} and has no apt-get to install it.",
                "Install Docker (dockerd and the docker CLI) and debootstrap with the host's package manager, "
                "then run provision again.",
            )
        if missing:
            env = ["env", "DEBIAN_FRONTEND=noninteractive"]
            change.add(
                f"install {' '.join(missing)}",
                {"op": "run", "argv": [*env, "apt-get", "update", "-q"], "timeout": 600},
                {
                    "op": "run",
                    "argv": [*env, "apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                    "timeout": 1800,
                },
            )
        daemon = st.get("daemon") or {}
        answering = bool(daemon.get("answering"))
        config_changed = userns_changed = False
        rollback: dict[str, Any] | None = None
        if p.configure_daemon:
            dj = st.get("daemon_json") or {}
            now = file_text(dj)
            remap = userns_decision(p.userns_remap, st.get("userns") or {}, st.get("foreign") or {}, now)
            try:
                want = merged_daemon_json(now, daemon_settings(p, remap.on, _userns_of(now)))
            except ValueError as e:
                raise PlanError(
                    f"{DAEMON_JSON} on {self.host.name} is not valid JSON ({e}).",
                    "Fix or remove the file by hand; labctl keeps the keys it does not own.",
                ) from None
            sub = plan_file(DAEMON_JSON, want, dj, mode=0o644)
            # Only new content needs the daemon restarted; a mode fixed alone does not.
            config_changed = any(op["op"] == "write_file" for op in sub.ops)
            if config_changed:
                userns_changed = _userns_of(now) != _userns_of(want)
                summary = sub.summary[0] + " (log limits, no-new-privileges, live-restore"
                summary += (", " if remap.on else "; ") + remap.why + ")"
                for op in sub.ops:
                    if op["op"] == "write_file" and dj.get("exists"):
                        op["backup"] = DAEMON_JSON_BACKUP
                rollback = {
                    "path": DAEMON_JSON,
                    "backup": DAEMON_JSON_BACKUP,
                    "existed": bool(dj.get("exists")),
                }
                change.add(
                    summary,
                    {"op": "mkdir", "path": paths.BACKUP_DIR, "mode": 0o700},
                    {"op": "mkdir", "path": "/etc/docker", "mode": 0o755},
                    *sub.ops,
                    diff="".join(sub.diffs),
                )
            else:
                change.ops += sub.ops
                change.summary += sub.summary
                if remap.withheld:  # nothing to write, but the recap says why remapping stays off
                    change.summary.append(remap.why)
        systemd = bool(st.get("systemd"))
        how = "docker.service" if systemd else "dockerd in the background"
        if not answering:
            action = "restart" if st.get("dockerd_pid") else "start"
            why = daemon.get("error") or "not running"
            op = self._dockerd(action, systemd)
            if rollback:
                op["rollback"] = rollback
            change.add(f"{action} {how} (the daemon does not answer: {why})", op)
        elif config_changed:
            op = self._dockerd("restart", systemd)
            op["rollback"] = rollback
            change.add(f"restart {how} ({DAEMON_JSON} changed; the old one is put back if it fails)", op)
        images: dict[str, Any] = st.get("images") or {}
        for lang in self.languages:
            r = RECIPES[lang]
            want_hash = recipe_hash(r)
            have = images.get(lang) or {}
            if not answering or userns_changed:
                # No images can be read now, or the restart moves Docker's storage: the build
                # op checks the label again when it runs and keeps an image that is current.
                why = (
                    "no daemon to list images yet" if not answering else "userns-remap moves Docker's storage"
                )
                summary = f"build {image_name(lang)} if it is not at recipe {want_hash} ({why})"
            elif not have:
                summary = f"build {image_name(lang)} (recipe {want_hash}: {' '.join(r.packages)})"
            elif have.get("recipe") != want_hash:
                summary = f"rebuild {image_name(lang)} (recipe {have.get('recipe')} -> {want_hash})"
            else:
                continue
            change.add(
                summary,
                {
                    "op": "sandbox_image",
                    "lang": lang,
                    "packages": list(r.packages),
                    "recipe": want_hash,
                    "suite": SUITE,
                    "mirror": p.mirror,
                },
            )
        return change

    @staticmethod
    def _dockerd(action: str, systemd: bool) -> dict[str, Any]:
        return {"op": "dockerd", "action": action, "systemd": systemd, "wait": 90}
