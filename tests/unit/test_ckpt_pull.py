"""`labctl ckpt pull` without a host: a real session's output (the reference trainer on the CPU)
found in a folder, a tarball and a zip, damaged files named, the run id, the safetensors export,
and the storage host's side (parts joined, committed, a model folder published) on real files."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tarfile
import zipfile
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.ckpt import library as ckpt_library
from labctl.agent.ckpt.pull import (
    PARTS,
    ckpt_commit_command,
    ckpt_state_command,
    model_publish_command,
    model_state_command,
)
from labctl.agent.core.errors import AgentError
from labctl.ckpt import pull
from labctl.output.errors import InputError
from tests.ckpt_session import session


@pytest.fixture(scope="module")
def working(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return session(tmp_path_factory.mktemp("session"))


def test_a_folder_a_tarball_and_a_zip_give_the_same_checkpoints(working: Path, tmp_path: Path) -> None:
    with pull.opened(working) as root:
        found, damaged = pull.scan(root)
        assert damaged == []
        assert [(f.step, f.rel) for f in found] == [
            (4, "checkpoints/step-00000004.pt"),
            (2, "checkpoints/step-00000002.pt"),
        ]
        assert pull.run_id_for(root, found[0], None) == "kaggle-1"
    tgz = tmp_path / "output.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(working, arcname="opt/ml/checkpoints")
        evil = tarfile.TarInfo("../../evil.json")
        evil.size = 2
        tar.addfile(evil, io.BytesIO(b"{}"))
        link = tarfile.TarInfo("opt/ml/checkpoints/step-00000009.pt")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    zipped = tmp_path / "output.zip"
    with zipfile.ZipFile(zipped, "w") as zf:
        for p in working.rglob("*"):
            if p.is_file():
                zf.write(p, "kaggle/working/" + p.relative_to(working).as_posix())
    for archive in (tgz, zipped):
        with pull.opened(archive) as root:
            got, damaged = pull.scan(root)
            assert damaged == [] and [(f.step, f.sha256) for f in got] == [(f.step, f.sha256) for f in found]
            assert pull.run_id_for(root, got[0], None) == "kaggle-1"
            assert not any(p.is_symlink() for p in root.rglob("*"))
    assert not (tmp_path.parent / "evil.json").exists() and not (tmp_path / "evil.json").exists()


def test_a_damaged_checkpoint_is_named(working: Path, tmp_path: Path) -> None:
    copy = tmp_path / "w"
    shutil.copytree(working, copy)
    pt = copy / "checkpoints" / "step-00000004.pt"
    data = bytearray(pt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pt.write_bytes(bytes(data))
    (copy / "checkpoints" / "step-00000002.json").unlink()
    found, damaged = pull.scan(copy)
    assert found == []
    assert damaged == [
        "checkpoints/step-00000002.pt: manifest missing (step-00000002.json)",
        damaged[1],
    ]
    assert damaged[1].startswith("checkpoints/step-00000004.pt: sha256 mismatch")


def test_the_run_id_comes_from_run_then_settings_then_the_checkpoint(tmp_path: Path) -> None:
    bare = session(tmp_path, run_id="from-the-pt", settings_file=False)
    found, _ = pull.scan(bare)
    assert pull.run_id_for(bare, found[0], None) == "from-the-pt"
    assert pull.run_id_for(bare, found[0], "mine") == "mine"
    with pytest.raises(InputError, match="--run"):
        pull.run_id_for(bare, found[0], "../x")
    (bare / "a.json").write_text(json.dumps({"run_id": "a"}))
    (bare / "b.json").write_text(json.dumps({"run_id": "b"}))
    with pytest.raises(InputError, match=r"several runs \(a, b\)"):
        pull.run_id_for(bare, found[0], None)


def test_the_export_is_a_tinylm_the_loader_builds_with_the_trained_weights(
    working: Path, tmp_path: Path
) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file

    from labctl.agent.models.tinylm import build_model

    found, _ = pull.scan(working)
    state = torch.load(str(found[0].pt), map_location="cpu", weights_only=True)
    out = pull.export_model(state, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["model_type"] == "tinylm" and config["d_model"] == 32
    with torch.device("meta"):
        model = build_model(config)
    model.load_state_dict(load_file(str(tmp_path / "m" / "model.safetensors")), assign=True, strict=True)
    for name, t in model.state_dict().items():
        assert torch.equal(t, state["model"][name]), name
    # The same checkpoint exported twice is the same bytes: a re-pull finds the model unchanged.
    pull.export_model(state, tmp_path / "again")
    assert (tmp_path / "again" / "model.safetensors").read_bytes() == (
        tmp_path / "m" / "model.safetensors"
    ).read_bytes()
    assert out["files"] == ["config.json", "model.safetensors"]


def put_parts(folder: str, name: str, data: bytes, size: int) -> list[dict[str, Any]]:
    """What upload_parts leaves on the host: the file cut in parts of `size`."""
    os.makedirs(os.path.join(folder, PARTS), exist_ok=True)
    parts = []
    for i in range(0, max(len(data), 1), size):
        piece = data[i : i + size]
        pname = f"{name}.{i // size:05d}"
        with open(os.path.join(folder, PARTS, pname), "wb") as f:
            f.write(piece)
        parts.append({"name": pname, "size": len(piece), "sha256": hashlib.sha256(piece).hexdigest()})
    return parts


def test_the_host_joins_parts_commits_once_and_drops_a_copy_that_does_not_verify(
    working: Path, tmp_path: Path
) -> None:
    lib = str(tmp_path / "lib")
    found, _ = pull.scan(working)
    f = found[0]
    incoming = ckpt_library.incoming_dir(lib, "r", f.step)
    os.makedirs(incoming)
    shutil.copy(f.manifest, incoming)
    parts = put_parts(incoming, f.pt.name, f.pt.read_bytes(), 4096)
    state = ckpt_state_command({"lib": lib, "run_id": "r", "steps": [f.step]})["steps"][str(f.step)]
    assert state["committed"] is None and len(state["parts"]) == len(parts)
    record = {"origin": "pull", "backed_up_at": "2027-01-01T00:00:00Z"}
    entry = ckpt_commit_command({"lib": lib, "run_id": "r", "step": f.step, "parts": parts, "record": record})
    assert entry["existed"] is False
    assert sorted(os.listdir(entry["path"])) == ["backup.json", f.manifest.name, f.pt.name]
    assert ckpt_library.check_entry(entry["path"], f.step) is None
    assert ckpt_library.read_record(entry["path"])["origin"] == "pull"  # type: ignore[index]
    again = ckpt_state_command({"lib": lib, "run_id": "r", "steps": [f.step]})["steps"][str(f.step)]
    assert again["committed"]["sha256"] == f.sha256
    # Parts that join into something else than the manifest says: refused, nothing left behind.
    os.makedirs(ckpt_library.incoming_dir(lib, "r", 2))
    shutil.copy(f.manifest, os.path.join(ckpt_library.incoming_dir(lib, "r", 2), "step-00000002.json"))
    bad = put_parts(ckpt_library.incoming_dir(lib, "r", 2), "step-00000002.pt", b"x" * 100, 64)
    with pytest.raises(AgentError, match="does not verify"):
        ckpt_commit_command({"lib": lib, "run_id": "r", "step": 2, "parts": bad, "record": record})
    assert not os.path.exists(ckpt_library.incoming_dir(lib, "r", 2))
    assert [e["step"] for e in ckpt_library.entries(lib)] == [f.step]


def test_a_model_folder_appears_whole_and_is_never_replaced(tmp_path: Path) -> None:
    models = str(tmp_path / "models")
    incoming = os.path.join(models, ".incoming-m")
    files = [
        {"name": "config.json", "parts": put_parts(incoming, "config.json", b"{}\n", 64)},
        {"name": "model.safetensors", "parts": put_parts(incoming, "model.safetensors", b"w" * 300, 128)},
    ]
    assert model_state_command({"models": models, "name": "m"})["exists"] is False
    done = model_publish_command({"models": models, "name": "m", "files": files})
    assert sorted(os.listdir(done["path"])) == ["config.json", "model.safetensors"]
    assert os.listdir(models) == ["m"]
    seen = model_state_command({"models": models, "name": "m"})
    assert seen["exists"] and seen["files"]["model.safetensors"]["size"] == 300
    with pytest.raises(AgentError, match="already exists"):
        model_publish_command({"models": models, "name": "m", "files": files})
    with pytest.raises(AgentError, match="not a model name"):
        model_state_command({"models": models, "name": ".hidden"})


def test_a_model_file_that_joins_into_other_bytes_than_were_exported_is_never_published(
    tmp_path: Path,
) -> None:
    models = str(tmp_path / "models")
    incoming = os.path.join(models, ".incoming-m")
    body = b"w" * 300
    sha = hashlib.sha256(body).hexdigest()
    parts = put_parts(incoming, "model.safetensors", body, 128)
    # Every part arrived as sent, but the file the controller exported was another one.
    files = [{"name": "model.safetensors", "parts": parts, "size": 300, "sha256": "0" * 64}]
    with pytest.raises(AgentError, match="does not match the file sent"):
        model_publish_command({"models": models, "name": "m", "files": files})
    assert os.listdir(models) == []
    parts = put_parts(incoming, "model.safetensors", body, 128)
    files = [{"name": "model.safetensors", "parts": parts, "size": 300, "sha256": sha}]
    done = model_publish_command({"models": models, "name": "m", "files": files})
    assert os.listdir(done["path"]) == ["model.safetensors"]
