"""STAND-IN for engineer A's recipes (python and c only, same shape): A's file replaces it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Optional

IMAGE_PREFIX = "labctl-sandbox/"


@dataclass(frozen=True)
class Recipe:
    name: str
    packages: tuple[str, ...]
    file: str
    compile: Optional[tuple[str, ...]]
    run: tuple[str, ...]
    hello: str
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def image(self) -> str:
        return image_name(self.name)


_HELLO_C = '#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n'
RECIPES: dict[str, Recipe] = {
    "python": Recipe("python", ("python3",), "main.py", None, ("python3", "main.py"), 'print("hello")\n'),
    "c": Recipe(
        "c", ("gcc", "libc6-dev"), "main.c", ("gcc", "-O1", "-o", "main", "main.c"), ("./main",), _HELLO_C
    ),
}


def image_name(lang: str) -> str:
    return f"{IMAGE_PREFIX}{lang}:latest"


def recipe(lang: str) -> Recipe:
    try:
        return RECIPES[lang]
    except KeyError:
        raise KeyError(f"no sandbox language {lang!r}; known: {', '.join(sorted(RECIPES))}") from None


def recipe_hash(r: Recipe) -> str:
    text = json.dumps({**asdict(r), "env": dict(sorted(r.env.items()))}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
