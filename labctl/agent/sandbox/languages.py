"""Each sandbox language as data: the Debian packages its image needs and how a program runs.

Pure, stdlib-only data (it sits with the host side so that both sides can read it): the
provision resource plans from it, the pool and the self-test read it. Adding a language is
one `Recipe(...)` line in RECIPES, and its name in the inventory's SANDBOX_LANGUAGES. A
program is written to `/work/<file>` inside the container; `compile` (when given) then `run` execute there.
`recipe_hash` labels each image, so a changed recipe (or BASE_VERSION) rebuilds exactly
the images it touches.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Optional

from . import LABEL_LANG, LABEL_RECIPE, image_name

__all__ = [
    "BASE_VERSION",
    "LABEL_LANG",
    "LABEL_RECIPE",
    "RECIPES",
    "SUITE",
    "Recipe",
    "image_name",
    "recipe",
    "recipe_hash",
]

# What every image shares: bump it when the base changes (suite, variant, image layout), and
# every image is rebuilt.
SUITE = "bookworm"
BASE_VERSION = f"debootstrap-minbase-{SUITE}-2"  # 2: /work is 1777 (tmpfs on it takes its mode)
# Toolchains that write caches under $HOME need one that the container's user can write.
_GO_ENV = {"GOCACHE": "/tmp/.gocache", "GOPATH": "/tmp/.gopath", "GO111MODULE": "off"}


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


def _r(
    name: str,
    packages: str,
    file: str,
    compile: Optional[str],
    run: str,
    hello: str,
    env: Optional[Mapping[str, str]] = None,
) -> Recipe:
    return Recipe(
        name,
        tuple(packages.split()),
        file,
        tuple(compile.split()) if compile else None,
        tuple(run.split()),
        hello,
        dict(env or {}),
    )


_HELLO_C = '#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n'
_HELLO_CPP = '#include <iostream>\nint main() { std::cout << "hello" << std::endl; return 0; }\n'
_HELLO_GO = 'package main\n\nimport "fmt"\n\nfunc main() { fmt.Println("hello") }\n'
_HELLO_JAVA = (
    'public class Main {\n  public static void main(String[] a) { System.out.println("hello"); }\n}\n'
)

RECIPES: dict[str, Recipe] = {
    r.name: r
    for r in (
        _r("python", "python3", "main.py", None, "python3 main.py", 'print("hello")\n'),
        _r("javascript", "nodejs", "main.js", None, "node main.js", 'console.log("hello");\n'),
        _r(
            "typescript",
            "nodejs node-typescript",
            "main.ts",
            "tsc --outDir . main.ts",
            "node main.js",
            'console.log("hello");\n',
        ),
        _r("bash", "bash", "main.sh", None, "bash main.sh", "echo hello\n"),
        _r("c", "gcc libc6-dev", "main.c", "gcc -O1 -o main main.c", "./main", _HELLO_C),
        _r("cpp", "g++ libc6-dev", "main.cpp", "g++ -O1 -o main main.cpp", "./main", _HELLO_CPP),
        _r("go", "golang-go", "main.go", "go build -o main main.go", "./main", _HELLO_GO, _GO_ENV),
        _r(
            "rust",
            "rustc gcc libc6-dev",
            "main.rs",
            "rustc -O -o main main.rs",
            "./main",
            'fn main() { println!("hello"); }\n',
        ),
        _r("java", "default-jdk-headless", "Main.java", "javac Main.java", "java -cp . Main", _HELLO_JAVA),
        _r("ruby", "ruby", "main.rb", None, "ruby main.rb", 'puts "hello"\n'),
        _r("perl", "perl", "main.pl", None, "perl main.pl", 'print "hello\\n";\n'),
        _r("php", "php-cli", "main.php", None, "php main.php", '<?php echo "hello\\n";\n'),
        _r("lua", "lua5.4", "main.lua", None, "lua5.4 main.lua", 'print("hello")\n'),
        _r("r", "r-base-core", "main.R", None, "Rscript main.R", 'cat("hello\\n")\n'),
        _r(
            "fortran",
            "gfortran libc6-dev",
            "main.f90",
            "gfortran -O1 -o main main.f90",
            "./main",
            "program main\n  print '(a)', 'hello'\nend program main\n",
        ),
    )
}


def recipe(lang: str) -> Recipe:
    """The recipe for `lang`; a KeyError names the languages there are."""
    try:
        return RECIPES[lang]
    except KeyError:
        raise KeyError(f"no sandbox language {lang!r}; known: {', '.join(sorted(RECIPES))}") from None


def recipe_hash(r: Recipe) -> str:
    """16 hex of sha256 over the recipe and BASE_VERSION: the image's `labctl.recipe` label."""
    doc = {"base": BASE_VERSION, **asdict(r)}
    doc["env"] = dict(sorted(r.env.items()))
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
