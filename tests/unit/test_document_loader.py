"""labctl.documents.loader: every document a user writes goes through one pipeline, so a
broken file reads the same whatever its kind, and each loader keeps only its own checks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from labctl.documents import loader
from labctl.documents.validation import DocumentError
from labctl.inventory.load import load_inventory
from labctl.orchestra.spec import load_orchestra
from labctl.output.errors import InputError
from labctl.plan.spec import load_plan
from labctl.provision.playbook import load_playbook

LOADERS: dict[str, Callable[[Path], Any]] = {
    "inventory": load_inventory,
    "playbook": load_playbook,
    "orchestra file": load_orchestra,
    "plan file": load_plan,
}


def test_each_loader_reads_through_the_pipeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    read: list[str] = []
    real = loader.read_document

    def spy(path: Path, kind: str, missing_hint: str) -> Any:
        read.append(kind)
        return real(path, kind, missing_hint)

    monkeypatch.setattr(loader, "read_document", spy)
    doc = tmp_path / "doc.yaml"
    doc.write_text("- a list, not a mapping\n")
    for kind, load in LOADERS.items():
        with pytest.raises(DocumentError) as err:
            load(doc)
        assert err.value.kind == kind and len(err.value.problems) == 1
    assert read == list(LOADERS)


def test_broken_yaml_gives_the_same_file_line_message_through_each_loader(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\nb: [\n")
    seen = set()
    for load in LOADERS.values():
        with pytest.raises(InputError) as err:
            load(bad)
        assert err.value.message.startswith(f"{bad}:3:1: the YAML does not parse: ")
        seen.add((err.value.message, err.value.hint))
    assert len(seen) == 1


def test_a_document_collects_every_problem_and_raises_once(tmp_path: Path) -> None:
    from labctl.inventory.model import CPU

    path = tmp_path / "d.yaml"
    path.write_text("cpu: {cores: 2}\ncpu: {cores: 4}\nbad: {sockets: 0}\nx: 1\n")

    def error(at: Path, problems: list[Any]) -> DocumentError:
        return DocumentError("test file", at, problems, "Fix it.")

    doc = loader.open_document(path, "test file", "Write one.", error)
    assert doc.problems == [(2, "cpu", "'cpu' appears twice (first on line 1); keep one")]
    data = doc.mapping("a mapping")
    assert doc.check(CPU, data["cpu"], ("cpu",)) is not None
    assert doc.check(CPU, data["bad"], ("bad",)) is None
    doc.add(("x",), "x is not wanted.")
    with pytest.raises(DocumentError) as err:
        doc.finish()
    assert [p[:2] for p in err.value.problems] == [(2, "cpu"), (3, "bad.sockets"), (4, "x")]
    with pytest.raises(InputError, match=f"^No test file at {tmp_path / 'none.yaml'}."):
        loader.open_document(tmp_path / "none.yaml", "test file", "Write one.", error)
