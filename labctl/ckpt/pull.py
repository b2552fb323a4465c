"""`labctl ckpt pull DIR|TARBALL`: a cloud session's checkpoints into the storage host's library.

A Kaggle `/kaggle/working` download or a SageMaker output tarball / checkpoint folder holds the
reference trainer's `step-XXXXXXXX.pt` + `.json` pairs, possibly in nested folders. They are
validated here first (every manifest read, every .pt re-hashed): a damaged one is named and the
pull refused, before anything is sent. Each valid checkpoint then goes to the storage host in
parts through labctl's own transport (`put_bytes` over the exec channel: a host without SFTP
takes them; a part that arrived in an interrupted pull is not sent again) and is committed
there by the agent (`ckpt_library.commit`, origin "pull"): a step already in the library with
the same sha256 is left as it is, so pulling twice changes nothing.

`--model NAME` also writes the newest checkpoint's weights as a model the RAM cache syncs from:
`storage.models/NAME/model.safetensors` + `config.json` (the tinylm config), as
`bench make-model` lays models out; torch and safetensors (the `torch` extra) read the .pt.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from labctl.agent.ckpt import library as ckpt_library
from labctl.agent.train.ckpt import FORMAT, CheckpointDir, manifest_name
from labctl.output.errors import InputError, install_extra
from labctl.output.progress import QUIET, Progress

if TYPE_CHECKING:
    from labctl.hosts.context import Context
    from labctl.hosts.fanout import HostRun
    from labctl.inventory.model import Host

PART_BYTES = 64 << 20  # one put_bytes: small enough to hold in memory, large enough to be quick
_STEP_FILE = re.compile(r"step-([0-9]{8})\.(pt|json)\Z")
_SETTINGS_MAX = 1 << 20  # a settings file is small; a bigger .json is not one


@dataclass(frozen=True)
class Found:
    """One valid checkpoint in the source."""

    step: int
    folder: Path
    rel: str  # the .pt's path inside the source, for messages and the record
    sha256: str
    bytes: int
    model: dict[str, Any]

    @property
    def pt(self) -> Path:
        return Path(CheckpointDir(str(self.folder)).pt_path(self.step))

    @property
    def manifest(self) -> Path:
        return Path(CheckpointDir(str(self.folder)).manifest_path(self.step))


# -- the source: a folder, or a tarball / zip unpacked --------------------------------------


def _safe_rel(name: str) -> PurePosixPath | None:
    rel = PurePosixPath(name.lstrip("/"))
    if not rel.parts or any(p in ("..", "") for p in rel.parts):
        return None
    return rel


def _wanted(rel: PurePosixPath) -> bool:
    return bool(_STEP_FILE.match(rel.name)) or rel.suffix == ".json"


@contextmanager
def opened(source: Path) -> Iterator[Path]:
    """The folder to scan: `source` itself, or a tarball / zip unpacked into a temporary folder
    (only its checkpoint and .json files, only plain files, never outside the folder)."""
    if source.is_dir():
        yield source
        return
    if not source.is_file():
        raise InputError(
            f"{source} does not exist.",
            "Give the folder a cloud session wrote (a Kaggle /kaggle/working download, a SageMaker "
            "checkpoint folder) or its tarball.",
        )
    with tempfile.TemporaryDirectory(prefix="labctl-pull-") as tmp:
        root = Path(tmp)
        try:
            if zipfile.is_zipfile(source):
                _unzip(source, root)
            else:
                _untar(source, root)
        except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as e:
            raise InputError(
                f"{source} is neither a folder nor a tarball or zip labctl can read ({e}).",
                "Give the session's output folder, or its .tar, .tar.gz or .zip as downloaded.",
            ) from None
        yield root


def _untar(source: Path, root: Path) -> None:
    with tarfile.open(source, "r:*") as tar:
        for member in tar:
            rel = _safe_rel(member.name)
            if rel is None or not member.isfile() or not _wanted(rel):
                continue
            src = tar.extractfile(member)
            if src is None:
                continue
            _write(root / rel, src)


def _unzip(source: Path, root: Path) -> None:
    with zipfile.ZipFile(source) as zf:
        for info in zf.infolist():
            rel = _safe_rel(info.filename)
            if rel is None or info.is_dir() or not _wanted(rel):
                continue
            with zf.open(info) as src:
                _write(root / rel, src)


def _write(dest: Path, src: Any) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)


# -- validation -------------------------------------------------------------------------------


def scan(root: Path) -> tuple[list[Found], list[str]]:
    """(the valid checkpoints, newest step first, one per step; 'PATH: reason' for each damaged one).

    The same step in two folders (two hosts' copies) is taken once, from the first folder.
    """
    found: dict[int, Found] = {}
    damaged: list[str] = []
    for dirpath, dirs, names in os.walk(root):
        dirs.sort()
        if not any(_STEP_FILE.match(n) for n in names):
            continue
        folder = Path(dirpath)
        ck = CheckpointDir(dirpath)
        valid, skipped = ck.scan()
        for bad in skipped:
            damaged.append(f"{Path(bad['path']).relative_to(root)}: {bad['reason']}")
        for step in valid:
            if step in found:
                continue
            manifest = ck.manifest(step)
            found[step] = Found(
                step,
                folder,
                str((folder / ck.pt_path(step)).relative_to(root)),
                str(manifest["sha256"]),
                int(manifest["bytes"]),
                dict(manifest.get("model") or {}),
            )
    return sorted(found.values(), key=lambda f: -f.step), damaged


def _settings_run_ids(root: Path) -> set[str]:
    """run_id of every trainer settings file (a .json object with run_id, not a manifest)."""
    ids: set[str] = set()
    for path in root.rglob("*.json"):
        if _STEP_FILE.match(path.name) or not path.is_file() or path.stat().st_size > _SETTINGS_MAX:
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("run_id"), str) and doc.get("format") != FORMAT:
            ids.add(doc["run_id"])
    return ids


def _load_state(path: Path) -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        raise InputError(
            f"Reading {path.name} needs torch, which is not installed here.",
            f"Install labctl's torch extra ({install_extra('torch')}), or give --run RUN.",
        ) from None
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise InputError(f"{path} is not a checkpoint of labctl's reference trainer.", "Pull another folder.")
    return state


def run_id_for(root: Path, newest: Found, given: str | None) -> str:
    """--run, else the run_id of the session's settings file, else the checkpoint's own settings."""
    if given is not None:
        run_id, where = given, "--run"
    else:
        ids = _settings_run_ids(root)
        if len(ids) > 1:
            raise InputError(
                f"The settings files in the pulled folder name several runs ({', '.join(sorted(ids))}).",
                "Say which run these checkpoints are with --run RUN.",
            )
        if ids:
            run_id, where = ids.pop(), "the session's settings"
        else:
            settings = _load_state(newest.pt).get("settings") or {}
            run_id, where = str(settings.get("run_id") or ""), f"{newest.rel}'s settings"
            if not run_id:
                raise InputError(f"{newest.rel} names no run.", "Give --run RUN.")
    try:
        return ckpt_library.check_run_id(run_id)
    except ckpt_library.LibraryError as e:
        raise InputError(f"{where}: {e}.", "Give --run with letters, digits, _ . + or -.") from None


def _parts_of(path: Path) -> Iterator[tuple[str, bytes, str]]:
    """(part name suffix, bytes, sha256) of each PART_BYTES piece of the file; one for an empty file."""
    with open(path, "rb") as f:
        n = 0
        while True:
            data = f.read(PART_BYTES)
            if not data and n:
                return
            yield f"{n:05d}", data, hashlib.sha256(data).hexdigest()
            n += 1


def upload_parts(
    run: HostRun, path: Path, part_dir: str, prefix: str, have: dict[str, dict[str, Any]]
) -> tuple[list[dict[str, Any]], int]:
    """Send `path` as parts PREFIX.NNNNN into `part_dir`, skipping those `have` already holds;
    ([{name, size, sha256}], bytes sent)."""
    parts: list[dict[str, Any]] = []
    sent = 0
    for suffix, data, sha in _parts_of(path):
        name = f"{prefix}.{suffix}"
        parts.append({"name": name, "size": len(data), "sha256": sha})
        if have.get(name) == {"size": len(data), "sha256": sha}:
            continue
        run.conn.put_bytes(data, f"{part_dir}/{name}", mode=0o644, dir_mode=0o755)
        sent += len(data)
    return parts, sent


def _record(found: Found, source: Path, now: str) -> dict[str, Any]:
    return {
        "origin": "pull",
        "source_host": socket.gethostname(),
        "source_path": str(source) + "::" + found.rel if not source.is_dir() else str(source / found.rel),
        "backed_up_at": now,
    }


def pull(
    ctx: Context,
    source: Path,
    run: str | None = None,
    storage: str | None = None,
    model: str | None = None,
    progress: Progress = QUIET,
    check: bool = False,
) -> dict[str, Any]:
    """Validate, upload and commit every valid checkpoint of `source`; the outcome as a dict.
    `check`: validate and say what would be sent, writing nothing on the host.

    Progress events, one per checkpoint: "in library", "would send" (--check) or "committed";
    with `model`: "exported", then "model present" or "model published"."""
    from labctl.ckpt.clock import iso, now
    from labctl.ckpt.library import find_storage
    from labctl.hosts.agent_ship import call_agent
    from labctl.hosts.fanout import on_host

    library = find_storage(ctx.inventory, storage)
    host, lib = library.host, library.path
    if model is not None:
        from labctl.cache.targets import check_models

        # `cache sync` reads the model library: a name it takes is one its rule accepts.
        check_models([model], "sync", "Give --model one folder name, e.g. --model tinylm-ft.")
    with opened(source) as root:
        found, damaged = scan(root)
        if damaged:
            raise InputError(
                f"{source} holds damaged checkpoints; nothing was pulled: " + "; ".join(damaged) + ".",
                "Download the session's output again, or delete the damaged files (the trainer skips "
                "them too) and pull again.",
            )
        if not found:
            raise InputError(
                f"{source} holds no checkpoint (no step-XXXXXXXX.pt with its .json manifest, in any folder).",
                "Give the folder the session wrote its checkpoints into, or its tarball.",
            )
        run_id = run_id_for(root, found[0], run)
        stamp = iso(now())
        exported = _export(root, found[0], model, progress) if model is not None else None

        def work(hr: HostRun) -> dict[str, Any]:
            steps = [f.step for f in found]
            state = call_agent(
                hr, "ckpt.pull_state", {"lib": lib, "run_id": run_id, "steps": steps}, read_only=check
            )
            # Both checked before anything is sent: a pull that would be refused changes nothing.
            shelf = _model_state(hr, host, model, exported, check) if exported is not None else None
            clash = [
                f"step {f.step} (library {str(s['committed'].get('sha256'))[:12]}..., pulled {f.sha256[:12]}...)"
                for f in found
                if (s := state["steps"][str(f.step)])["committed"]
                and s["committed"].get("sha256") not in (f.sha256, None)
            ]
            if clash:
                raise InputError(
                    f"{host.name}'s library already holds other checkpoints of {run_id} at "
                    + ", ".join(clash)
                    + "; nothing was pulled.",
                    "These are another run's: pull them under another name with --run RUN.",
                )
            pulled = []
            for f in sorted(found, key=lambda f: f.step):
                info = state["steps"][str(f.step)]
                item = {"step": f.step, "source": f.rel, "bytes": f.bytes, "sha256": f.sha256}
                damaged = (info["committed"] or {}).get("damaged")
                if info["committed"] and not damaged:
                    pulled.append({**item, "action": "present", "path": info["committed"]["path"]})
                    progress.event("in library", run_id=run_id, step=f.step, host=host.name)
                    continue
                if damaged:
                    item["replaces_damaged"] = damaged
                if check:
                    where = ckpt_library.step_dir(lib, run_id, f.step)
                    pulled.append(
                        {**item, "action": "would replace" if damaged else "would commit", "path": where}
                    )
                    progress.event(
                        "would send",
                        run_id=run_id,
                        step=f.step,
                        damaged=bool(damaged),
                        bytes=f.bytes,
                        path=where,
                    )
                    continue
                incoming = ckpt_library.incoming_dir(lib, run_id, f.step)
                hr.conn.put_bytes(
                    f.manifest.read_bytes(), f"{incoming}/{manifest_name(f.step)}", dir_mode=0o755
                )
                parts, sent = upload_parts(hr, f.pt, f"{incoming}/.parts", f.pt.name, info["parts"])
                entry = call_agent(
                    hr,
                    "ckpt.pull_commit",
                    {
                        "lib": lib,
                        "run_id": run_id,
                        "step": f.step,
                        "parts": parts,
                        "record": _record(f, source, stamp),
                    },
                    timeout=max(120.0, f.bytes / 50e6),
                )
                action = "replaced" if entry.get("replaced") else "committed"
                pulled.append({**item, "action": action, "path": entry["path"], "sent_bytes": sent})
                progress.event(
                    "committed",
                    run_id=run_id,
                    step=f.step,
                    action=action,
                    path=entry["path"],
                    host=host.name,
                    replaced=entry.get("replaced"),
                )
            out: dict[str, Any] = {
                "run_id": run_id,
                "storage": host.name,
                "library": lib,
                "checkpoints": pulled,
            }
            if shelf is not None and exported is not None and check:
                action = "present" if shelf["exists"] else "would publish"
                out["model"] = {
                    "name": model,
                    "path": shelf["path"],
                    "step": exported["step"],
                    "action": action,
                }
            elif shelf is not None and exported is not None:
                out["model"] = _publish(hr, shelf, exported, progress)
            return out

        try:
            return on_host(ctx, host, work)
        finally:
            if exported is not None:
                shutil.rmtree(exported["folder"], ignore_errors=True)


# -- a model for the RAM cache ---------------------------------------------------------------


def export_model(state: dict[str, Any], folder: Path) -> dict[str, Any]:
    """The checkpoint's model weights as `folder/model.safetensors` + `config.json` (the tinylm
    config, weights in its dtype), named and shaped as tinylm.param_shapes says."""
    import torch
    from safetensors.torch import save_file

    from labctl.agent.models.tinylm import DTYPE_NAMES, check_config, param_shapes

    config = dict(state.get("config") or {})
    config.setdefault("model_type", "tinylm")
    try:
        check_config(config)
        shapes = param_shapes(config)
    except ValueError as e:
        raise InputError(
            f"The checkpoint's model config cannot be exported: {e}.", "Pull without --model."
        ) from None
    weights = state.get("model") or {}
    dtypes = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
    tensors = {}
    for name, (shape, st_dtype) in shapes.items():
        t = weights.get(name)
        if t is None or tuple(t.shape) != shape:
            raise InputError(
                f"The checkpoint's weights do not fit its config: {name} is "
                f"{'missing' if t is None else tuple(t.shape)}, the config wants {shape}.",
                "Pull without --model; this checkpoint is not a tinylm the cache's loader can build.",
            )
        tensors[name] = t.detach().to("cpu", dtypes[DTYPE_NAMES[st_dtype]]).contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return {"folder": folder, "config": config, "files": ["config.json", "model.safetensors"]}


def _export(root: Path, newest: Found, model: str, progress: Progress) -> dict[str, Any]:
    state = _load_state(newest.pt)
    folder = Path(tempfile.mkdtemp(prefix="labctl-export-"))
    try:
        out = export_model(state, folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    out["step"] = newest.step
    progress.event("exported", model=model, step=newest.step)
    return out


def _sha_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _model_state(
    hr: HostRun, host: Host, name: str | None, exported: dict[str, Any], check: bool
) -> dict[str, Any]:
    """The model library's side of NAME: refused when it holds another model."""
    from labctl.hosts.agent_ship import call_agent

    assert host.storage is not None and name is not None
    models = host.storage.models
    folder: Path = exported["folder"]
    local = {
        f: {"size": (folder / f).stat().st_size, "sha256": _sha_file(folder / f)} for f in exported["files"]
    }
    state = call_agent(hr, "ckpt.publish_state", {"models": models, "name": name}, read_only=check)
    if state["exists"] and state["files"] != local:
        raise InputError(
            f"{host.name}:{state['path']} already holds another model; nothing was pulled.",
            "Give --model another name, or remove that folder first.",
        )
    return {**state, "models": models, "name": name, "local": local}


def _publish(
    hr: HostRun, shelf: dict[str, Any], exported: dict[str, Any], progress: Progress
) -> dict[str, Any]:
    from labctl.hosts.agent_ship import call_agent

    name, models = shelf["name"], shelf["models"]
    out = {"name": name, "path": shelf["path"], "step": exported["step"], "config": exported["config"]}
    if shelf["exists"]:
        progress.event("model present", name=name, host=hr.host.name)
        return {**out, "action": "present"}
    folder: Path = exported["folder"]
    incoming = f"{models.rstrip('/')}/.incoming-{name}"
    files = []
    for fname in exported["files"]:
        parts, _ = upload_parts(hr, folder / fname, f"{incoming}/.parts", fname, shelf["parts"])
        # The whole file's size and sha256 too: the host checks the joined file before publishing.
        files.append({"name": fname, "parts": parts, **shelf["local"][fname]})
    done = call_agent(hr, "ckpt.publish", {"models": models, "name": name, "files": files}, timeout=600)
    progress.event("model published", name=name, host=hr.host.name, path=done["path"])
    return {**out, "action": "published"}
