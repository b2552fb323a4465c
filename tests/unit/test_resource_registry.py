"""The resource types live in one table of the registry shape (name -> "module:class"):
playbook validation, the engine and every list of types read the same names, and a resource
module is imported only when its type is used."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import labctl.provision.resources as resources_pkg
from labctl.documents.validation import DocumentError
from labctl.provision.playbook import load_playbook
from labctl.provision.resource import RESOURCES, Resource, resource_class, resource_types


def test_each_entry_names_the_class_of_that_type() -> None:
    for name, entry in RESOURCES.items():
        assert entry.startswith("labctl.provision.resources.")
        cls = resource_class(name)
        assert issubclass(cls, Resource) and cls.type_name == name
    assert resource_types() == sorted(RESOURCES)


def test_every_resource_class_in_the_package_is_in_the_table() -> None:
    defined = set()
    for path in Path(resources_pkg.__file__).parent.glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and any(
                isinstance(b, ast.Name) and b.id == "Resource" for b in node.bases
            ):
                defined.add(f"labctl.provision.resources.{path.stem}:{node.name}")
    assert defined == set(RESOURCES.values())


def test_the_type_names_are_known_without_importing_a_resource() -> None:
    code = (
        "import json, sys\n"
        "import labctl.provision.resources\n"
        "from labctl.provision.resource import resource_types\n"
        "resource_types()\n"
        "print(json.dumps([m for m in sys.modules if m.startswith('labctl.provision.resources.')]))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(r.stdout) == []


def test_a_playbook_offers_the_tables_types(tmp_path: Path) -> None:
    book = tmp_path / "p.yaml"
    book.write_text("name: t\nplays:\n  - hosts: all\n    resources:\n      - crn: {}\n")
    with pytest.raises(DocumentError) as err:
        load_playbook(book)
    assert f"Types: {', '.join(resource_types())}; other keys: name, tags." in err.value.message
