"""Sandbox images built without any registry: Debian packages into a root filesystem, imported.

`build_image` runs `debootstrap --variant=minbase --include=PACKAGES` into a temp folder,
then `tar | docker import` with the labels `labctl.recipe=HASH` and `labctl.lang=LANG`, as
`labctl-sandbox/LANG:latest`. An image that already carries the recipe's hash is kept. Builds
of one language are serialized by a lock file (two provisions, or a test session beside
another), and the temp folder goes whatever happens, after anything debootstrap left
mounted in it is unmounted (a bind-mounted /dev removed file by file would be the host's).
Standard library only, Python 3.8; the recipe comes as data from the controller.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional

from ..core import paths
from ..core.errors import AgentError
from ..core.spec import Or, command
from . import LABEL_LANG, LABEL_RECIPE, image_name
from .dockercli import docker

DEFAULT_MIRROR = "http://deb.debian.org/debian"
# An imported image has no environment: give every container a PATH, UTF-8 and its work folder.
CHANGES = ["ENV PATH=/usr/local/bin:/usr/bin:/bin", "ENV LANG=C.UTF-8", "WORKDIR /work"]


def list_images() -> List[Dict[str, Any]]:
    """Every image with a labctl.lang label: {image (None when untagged), lang, recipe, id, size_bytes, created}."""
    r = docker(["image", "ls", "-q", "--no-trunc", "--filter", "label=" + LABEL_LANG])
    if r.returncode != 0:
        raise AgentError("docker image ls failed: " + (r.stderr or r.stdout).strip(), "docker_failed")
    ids = sorted(set(r.stdout.split()))
    if not ids:
        return []
    r = docker(["image", "inspect", *ids])
    if r.returncode == 0:
        return _describe(json.loads(r.stdout))
    out = []  # one was removed in between: describe the others one by one
    for one in ids:
        r = docker(["image", "inspect", one])
        out += _describe(json.loads(r.stdout)) if r.returncode == 0 else []
    return out


def _describe(docs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    out = []
    for d in docs:
        labels = (d.get("Config") or {}).get("Labels") or {}
        lang = labels.get(LABEL_LANG, "")
        tags = d.get("RepoTags") or []
        out.append(
            {
                "image": image_name(lang) if image_name(lang) in tags else None,
                "lang": lang,
                "recipe": labels.get(LABEL_RECIPE),
                "id": d.get("Id"),
                "size_bytes": d.get("Size"),
                "created": d.get("Created"),
            }
        )
    return out


def current(lang: str) -> Optional[Dict[str, Any]]:
    """The tagged image of `lang` as list_images describes it, or None."""
    r = docker(["image", "inspect", image_name(lang)])
    if r.returncode != 0:
        return None
    found = _describe(json.loads(r.stdout))
    return found[0] if found and found[0]["image"] else None


@command(
    takes={},
    answers={"images": [{"image?": "str?", "lang?": "str?"}]},
)
def images_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Agent command `sandbox.images`: {"images": [...]} (see list_images)."""
    return {"images": list_images()}


def _mounts_under(root: str) -> List[str]:
    root = os.path.realpath(root)
    found = []
    with open("/proc/self/mounts") as f:
        for line in f:
            mnt = line.split()[1].replace("\\040", " ")
            if mnt == root or mnt.startswith(root + "/"):
                found.append(mnt)
    return found


def remove_root(root: str) -> None:
    """Remove a build folder, unmounting first what debootstrap left there; refuse if that fails."""
    for mnt in sorted(_mounts_under(root), key=len, reverse=True):
        subprocess.run(["umount", "-l", mnt], capture_output=True)
    left = _mounts_under(root)
    if left:
        raise AgentError(
            "{} still has mounts ({}); it was left in place rather than removed through them".format(
                root, ", ".join(left)
            ),
            "op_failed",
        )
    shutil.rmtree(root, ignore_errors=True)


def _tail(text: str, n: int = 8) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return "\n".join(lines[-n:])[-2000:]


def _debootstrap(root: str, packages: List[str], suite: str, mirror: str, timeout: float) -> None:
    exe = shutil.which("debootstrap")
    if exe is None:
        raise AgentError("debootstrap is not installed (apt-get install debootstrap)", "op_failed")
    cache = os.path.join(paths.SANDBOX_DIR, "debs")  # .debs shared by every language's build
    os.makedirs(cache, exist_ok=True)
    argv = [exe, "--variant=minbase", "--cache-dir=" + cache]
    if packages:
        argv.append("--include=" + ",".join(packages))
    argv += [suite, root, mirror]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise AgentError(f"debootstrap ran past {timeout:g} s", "op_failed") from None
    if r.returncode != 0:
        log = ""
        try:
            with open(os.path.join(root, "debootstrap", "debootstrap.log"), errors="replace") as f:
                log = f.read()
        except OSError:
            pass
        raise AgentError(
            "debootstrap {} with {} exited {}: {}".format(
                suite, ",".join(packages), r.returncode, _tail(r.stderr + r.stdout) + "\n" + _tail(log, 4)
            ),
            "op_failed",
        )


def _scrub(root: str) -> None:
    """What debootstrap copied from the host (its DNS server, its name) or keeps only for apt."""
    for rel in ("etc/resolv.conf", "etc/hostname"):
        path = os.path.join(root, rel)
        if os.path.lexists(path):
            os.unlink(path)
        with open(path, "w") as f:
            f.write("sandbox\n" if rel == "etc/hostname" else "")
    for rel in ("var/cache/apt/archives", "var/lib/apt/lists"):
        folder = os.path.join(root, rel)
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            path = os.path.join(folder, name)
            if os.path.isfile(path) and not os.path.islink(path) and name != "lock":
                os.unlink(path)
    # A tmpfs Docker mounts on /work takes this folder's mode: writable by the sandbox's
    # user (65534) like /tmp, sticky so one user cannot remove another's files.
    work = os.path.join(root, "work")
    os.makedirs(work, exist_ok=True)
    os.chmod(work, 0o1777)


def _import(root: str, lang: str, recipe: str) -> None:
    cmd = ["import"]
    for change in [
        *CHANGES,
        f"LABEL {LABEL_RECIPE}={recipe}",
        f"LABEL {LABEL_LANG}={lang}",
    ]:
        cmd += ["--change", change]
    cmd += ["-", image_name(lang)]
    tar = subprocess.Popen(
        ["tar", "--numeric-owner", "-C", root, "-c", "."], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        r = docker(cmd, timeout=1800, stdin=tar.stdout)
    finally:
        assert tar.stdout is not None
        tar.stdout.close()
        tar_err = tar.stderr.read().decode("utf-8", "replace") if tar.stderr else ""
        tar_rc = tar.wait()
    if tar_rc != 0:
        raise AgentError(f"tar of {root} exited {tar_rc}: {_tail(tar_err)}", "op_failed")
    if r.returncode != 0:
        raise AgentError(f"docker import exited {r.returncode}: {_tail(r.stderr)}", "op_failed")


def build_image(
    lang: str,
    packages: List[str],
    recipe: str,
    suite: str = "bookworm",
    mirror: str = DEFAULT_MIRROR,
    force: bool = False,
    timeout: float = 3000,
) -> Dict[str, Any]:
    """Build `labctl-sandbox/LANG:latest` labelled with `recipe` unless it already is.

    Returns {lang, image, recipe, built, seconds, size_bytes}; `built` is False when the image
    with that label was there. Needs root (debootstrap) and a Debian mirror the host reaches.
    """
    problem = paths.component_problem(lang)
    if problem:
        # The language names the build's lock file and temp root, which a build of it removes.
        raise AgentError(f"sandbox language {lang!r}: {problem}", "bad_args")
    if os.geteuid() != 0:
        raise AgentError("building a sandbox image needs root (debootstrap); connect as root", "op_failed")
    start = time.monotonic()
    os.makedirs(paths.SANDBOX_DIR, mode=0o700, exist_ok=True)
    with open(os.path.join(paths.SANDBOX_DIR, f"build-{lang}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # Checked under the lock: a build that waited finds the one before it done.
        old = current(lang)
        if old and old["recipe"] == recipe and not force:
            return {
                "lang": lang,
                "image": image_name(lang),
                "recipe": recipe,
                "built": False,
                "seconds": round(time.monotonic() - start, 1),
                "size_bytes": old["size_bytes"],
            }
        build_dir = os.path.join(paths.SANDBOX_DIR, "build")
        os.makedirs(build_dir, mode=0o700, exist_ok=True)
        for name in os.listdir(build_dir):
            if name.startswith(lang + "-"):  # left by a build that was killed (its /proc still mounted)
                remove_root(os.path.join(build_dir, name))
        root = tempfile.mkdtemp(prefix=lang + "-", dir=build_dir)
        try:
            _debootstrap(root, packages, suite, mirror, timeout)
            _scrub(root)
            _import(root, lang, recipe)
        finally:
            remove_root(root)
        new = current(lang)
        if new is None or new["recipe"] != recipe:
            raise AgentError(
                f"docker import ran but {image_name(lang)} is not labelled {recipe}", "op_failed"
            )
        # The replaced image, and any earlier one of this language left untagged: prune only
        # takes dangling images no container runs, so a pool's old containers keep theirs.
        docker(["image", "prune", "-f", "--filter", f"label={LABEL_LANG}={lang}"], timeout=300)
    return {
        "lang": lang,
        "image": image_name(lang),
        "recipe": recipe,
        "built": True,
        "seconds": round(time.monotonic() - start, 1),
        "size_bytes": new["size_bytes"],
    }


def build_op(op: Dict[str, Any]) -> str:
    """Apply op "sandbox_image": {lang, packages, recipe, suite?, mirror?, force?}."""
    r = build_image(
        op["lang"],
        list(op.get("packages") or []),
        op["recipe"],
        suite=op.get("suite", "bookworm"),
        mirror=op.get("mirror", DEFAULT_MIRROR),
        force=bool(op.get("force")),
    )
    if not r["built"]:
        return "{} was already built from recipe {}".format(r["image"], r["recipe"])
    return "built {} (recipe {}) in {:.0f} s, {:.0f} MB".format(
        r["image"], r["recipe"], r["seconds"], (r["size_bytes"] or 0) / 1e6
    )


@command(
    takes={"images": Or(["any"], [])},
    answers={"results": [{}]},
)
def build_command(args: Dict[str, Any]) -> Dict[str, Any]:
    """Agent command `sandbox.build`: {"images": [op, ...]} → {"results": [build_image's dict, ...]}."""
    results = []
    for op in args["images"]:
        results.append(
            build_image(
                op["lang"],
                list(op.get("packages") or []),
                op["recipe"],
                suite=op.get("suite", "bookworm"),
                mirror=op.get("mirror", DEFAULT_MIRROR),
                force=bool(op.get("force")),
            )
        )
    return {"results": results}
