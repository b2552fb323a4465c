"""Check a manifest against an upstream CRD's openAPIV3Schema, as the API server would.

Kubernetes cannot run here, so the CRD YAML is kept under tests/crds/ (each file names the
release it came from) and its schema is turned into a JSON Schema with the API server's rules:
- unknown fields are rejected (`kubectl apply --validate=strict`): every object schema that lists
  `properties` gets `additionalProperties: false`, unless it says
  `x-kubernetes-preserve-unknown-fields`;
- `x-kubernetes-int-or-string` takes an integer or a string; `nullable` takes null;
- `metadata` is ObjectMeta, which the API server checks itself (the CRD leaves it open).
The CEL rules (`x-kubernetes-validations`) are not evaluated: a test states those it relies on.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).parent / "crds"


@cache
def crd_schema(crd_file: str, version: str) -> dict[str, Any]:
    """The JSON Schema for `version` of the CRD in tests/crds/`crd_file`."""
    crd = yaml.safe_load((CRDS / crd_file).read_text())
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return _strict(copy.deepcopy(v["schema"]["openAPIV3Schema"]), top=True)
    raise KeyError(f"{crd_file} has no version {version}")


def errors(doc: dict[str, Any], crd_file: str, version: str) -> list[str]:
    """Every schema violation in `doc`, as 'path: message' (empty when it passes)."""
    validator = jsonschema.Draft7Validator(crd_schema(crd_file, version))
    return sorted(
        f"{'.'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in validator.iter_errors(doc)
    )


def _strict(node: dict[str, Any], top: bool = False) -> dict[str, Any]:
    out = {k: v for k, v in node.items() if not k.startswith("x-kubernetes-validations")}
    if "properties" in out:
        out["properties"] = {name: _strict(sub) for name, sub in out["properties"].items()}
        if top:
            out["properties"]["metadata"] = {"type": "object"}
    for key in ("items", "not"):
        if isinstance(out.get(key), dict):
            out[key] = _strict(out[key])
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(out["additionalProperties"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in out:
            out[key] = [_strict(sub) for sub in out[key]]
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    preserve = out.pop("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in out and "additionalProperties" not in out and not preserve:
        out["additionalProperties"] = False
    for key in [k for k in out if k.startswith("x-kubernetes-")]:
        out.pop(key)
    return out
