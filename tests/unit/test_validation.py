"""labctl.documents.validation: one way to read, check and report a YAML document, whatever its kind."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from labctl.documents.validation import (
    DocumentError,
    dotted,
    duplicate_problems,
    fix_the_lines,
    problems_from,
    read_document,
    unknown_key,
)
from labctl.documents.yamlpos import load_positioned
from labctl.inventory.load import InventoryError, load_inventory
from labctl.output.errors import InputError
from labctl.provision.playbook import load_playbook
from labctl.train.phases import load_phases


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size_gb: float = Field(gt=0, description="size_gb: 20")


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="name: m5")
    port: int = Field(22, le=65535)
    inner: Optional[Inner] = None
    items: list[Inner] = Field(default_factory=list)


def errors_of(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as err:
        Outer.model_validate(data)
    return err.value


def test_document_error_renders_the_kind_every_problem_and_the_hint(tmp_path: Path) -> None:
    path = tmp_path / "orchestra.yaml"
    err = DocumentError(
        "orchestra file",
        path,
        [(3, "models[0].name", "'name' is required."), (None, "", "the file is empty")],
        hint="Fix it.",
    )
    assert isinstance(err, InputError) and err.exit_code == 2
    assert err.message == (
        f"The orchestra file {path} has 2 problems:\n"
        f"  {path}:3: models[0].name: 'name' is required.\n"
        f"  {path}: the file is empty"
    )
    assert err.hint == "Fix it." and err.kind == "orchestra file" and len(err.problems) == 2
    one = DocumentError("playbook", path, [(1, "plays", "x")], hint="")
    assert one.message.startswith(f"The playbook {path} has 1 problem:\n")


def test_fix_the_lines_counts() -> None:
    assert fix_the_lines(1, "then check") == "Fix the line named above; then check."
    assert fix_the_lines(2, "then check") == "Fix the lines named above; then check."


def test_problems_from_names_line_dotted_field_and_did_you_mean() -> None:
    pos = load_positioned("hosts:\n  m5:\n    name: m5\n    inner: {size_gb: 1, size_gbb: 3}\n")
    exc = errors_of(pos.data["hosts"]["m5"])
    ((line, field, message),) = problems_from(exc, Outer, ("hosts", "m5"), pos)
    assert (line, field) == (4, "hosts.m5.inner.size_gbb")
    assert message == "unknown key 'size_gbb'. Did you mean 'size_gb'? Keys allowed here: size_gb."


def test_problems_from_walks_lists_and_explains_with_the_description() -> None:
    exc = errors_of({"name": "m5", "items": [{"size_gb": 1}, {"size_gb": -1}], "port": 70000})
    found = {field: message for _, field, message in problems_from(exc, Outer)}
    assert found["items[1].size_gb"] == "Input should be greater than 0 (got -1). Write size_gb: 20."
    assert found["port"] == "Input should be less than or equal to 65535 (got 70000)."


def test_problems_from_without_positions_has_no_lines() -> None:
    problems = problems_from(errors_of({"port": 1}), Outer)
    assert problems == [(None, "name", "'name' is required. Write name: m5.")]


def test_unknown_key_and_dotted() -> None:
    assert unknown_key("hots", ["hosts", "plays"]) == (
        "unknown key 'hots'. Did you mean 'hosts'? Keys allowed here: hosts, plays."
    )
    assert unknown_key("zzz", ["hosts"]) == "unknown key 'zzz'. Keys allowed here: hosts."
    assert dotted(("hosts", "m5", "gpus", 0, "model")) == "hosts.m5.gpus[0].model"
    assert dotted(()) == ""


def test_duplicate_keys_are_problems() -> None:
    pos = load_positioned("a: 1\nb:\n  c: 1\n  c: 2\n")
    assert duplicate_problems(pos) == [(4, "b.c", "'c' appears twice (first on line 3); keep one")]


def test_read_document_missing_unparsable_and_unreadable(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        read_document(tmp_path / "none.yaml", "orchestra file", "Write one.")
    assert (
        err.value.message == f"No orchestra file at {tmp_path / 'none.yaml'}."
        and err.value.hint == "Write one."
    )
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\nb: [\n")
    with pytest.raises(InputError, match=rf"^{bad}:3:1: the YAML does not parse: "):
        read_document(bad, "playbook", "")
    with pytest.raises(InputError, match=f"^Cannot read the phases file {tmp_path}: "):
        read_document(tmp_path, "phases file", "")
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(InputError, match=f"^Cannot read the inventory {latin}: ") as err:
        read_document(latin, "inventory", "")
    assert "UTF-8" in err.value.hint
    good = tmp_path / "good.yaml"
    good.write_text("a:\n  b: 1\n")
    pos = read_document(good, "playbook", "")
    assert pos.data == {"a": {"b": 1}} and pos.line_of(("a", "b")) == 2


def test_each_document_kind_names_itself_and_its_check_command(tmp_path: Path) -> None:
    inv = tmp_path / "inv.yaml"
    inv.write_text("lab: t\nhosts:\n  a: {address: 10.0.0.1, rolez: [x]}\n")
    with pytest.raises(InventoryError) as e_inv:
        load_inventory(inv)
    assert e_inv.value.message.startswith(f"The inventory {inv} has 1 problem:\n  {inv}:3: hosts.a.rolez:")
    assert "labctl inventory validate" in e_inv.value.hint

    book = tmp_path / "book.yaml"
    book.write_text("plays:\n  - hosts: all\n    resources:\n      - modle_cache: {}\n")
    with pytest.raises(DocumentError) as e_book:
        load_playbook(book)
    assert e_book.value.message.startswith(
        f"The playbook {book} has 1 problem:\n  {book}:4: plays[0].resources[0]:"
    )
    # with -p: a bare --check would validate the default playbook instead of this one
    assert e_book.value.hint == (
        f"Fix the line named above; `labctl provision -p {book} --check` validates without changing anything."
    )

    phases = tmp_path / "train.yaml"
    phases.write_text("phases:\n  1: {stpes: 3}\n  zero: {}\n")
    with pytest.raises(DocumentError) as e_ph:
        load_phases(phases)
    assert e_ph.value.message.startswith(
        f"The phases file {phases} has 2 problems:\n  {phases}:2: phases[1].stpes:"
    )
    # the file's own phase and -f: the command runs as written and checks this file again
    assert e_ph.value.hint == (
        f"Fix the lines named above; `labctl train --phase 1 -f {phases} --check` validates without launching."
    )


def test_importing_validation_stays_light() -> None:
    code = "import sys, labctl.documents.validation; print(sorted(m for m in ('pydantic', 'yaml') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_unquoted_bang_value_is_a_yaml_error_with_the_fix_not_a_traceback(tmp_path: Path) -> None:
    book = tmp_path / "book.yaml"
    book.write_text("name: x\nplays:\n  - hosts: !m6\n    resources: []\n")
    with pytest.raises(InputError) as err:
        read_document(book, "playbook", "")
    assert err.value.message.startswith(f"{book}:3:12: the YAML does not parse: ")
    assert "tag '!m6'" in err.value.message and "quote it" in err.value.message
