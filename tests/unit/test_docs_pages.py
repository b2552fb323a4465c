"""The docs a newcomer walks: a short README that points to one guide per feature, links that
lead somewhere, a layout page that matches the tree, and no comment that cites a file the
repository does not have."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
LAYOUT = DOCS / "layout.md"

# [text](target) and ![alt](target "title"); the target ends at a blank or the closing paren.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
BACKTICKS = re.compile(r"`([^`\n]+)`")
# A placeholder or a glob, not a path: `labctl/<feature>/`, `tests/unit/test_*.py`, `…`.
PLACEHOLDER = re.compile(r"[<>*{}\[\]…|]")

# A file of this repository named in a comment: a path under one of its top folders, or any
# markdown file by its bare name (read from the repository root). The character before must not
# continue a path or a URL, so `mylab/inventory/lab.yaml` and `https://host/x.md` are not taken.
# A bare name right after a possessive ("PyTorch's RELEASE.md", "its RELEASE.md") is another
# project's file, and an all-capitals folder or stem in a path (`playbooks/NAME.yaml`) a placeholder.
TOP = r"(?:labctl|tests|docs|bench|playbooks|inventory)"
REF = re.compile(rf"(?<![\w./:-])(?:{TOP}/[^\s`'\"(),:;]*|(?<!'s )(?<!\bits )[\w-]+\.md\b)")
URL = re.compile(r"\w+://\S+")
CAPITALS = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _markdown_pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _relative_links(text: str) -> list[str]:
    """Every link target of a markdown page that points into the repository: not a URL, not a
    bare `#anchor`, not inside a fenced code block; the `#anchor` part dropped."""
    out = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def labctl_paths(text: str) -> set[str]:
    """The `labctl/...` paths a page names in backticks, as written (a folder keeps its `/`).

    A span is taken when it starts with `labctl/`; a span with a placeholder or a glob in it
    (`labctl/<feature>/`, `labctl/agent/*`) names no one path and is left out. A trailing `'s`,
    full stop or comma is not part of the path."""
    out = set()
    for span in BACKTICKS.findall(text):
        span = span.strip()
        if not span.startswith("labctl/") or PLACEHOLDER.search(span):
            continue
        path = re.split(r"[\s:(),;']", span, maxsplit=1)[0].rstrip(".,")
        out.add(path)
    return out


def _packages() -> list[str]:
    """Every package under labctl/ (a folder with __init__.py), as `labctl/agent/cache/`."""
    return sorted(
        f"{p.parent.relative_to(REPO).as_posix()}/"
        for p in (REPO / "labctl").rglob("__init__.py")
        if "__pycache__" not in p.parts and p.parent != REPO / "labctl"
    )


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and every module, class and function docstring; a
    docstring's lines are numbered as in the file."""
    source = path.read_text(encoding="utf-8")
    out: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                for i, line in enumerate(first.value.value.splitlines()):
                    out.append((first.lineno + i, line))
    return out


def file_references(text: str) -> list[str]:
    """The repository files a piece of prose names: a path under one of the repository's top
    folders, or a markdown file by its bare name. URLs, placeholders and globs are not references."""
    refs = []
    for token in REF.findall(URL.sub(" ", text)):
        token = token.rstrip(".,'")
        if not token or PLACEHOLDER.search(token):
            continue
        if "/" in token and any(CAPITALS.match(part.split(".")[0]) for part in token.split("/")[1:]):
            continue
        refs.append(token)
    return refs


def _exists(ref: str) -> bool:
    """A path exists as written, or names a Python module without its `.py`."""
    return (REPO / ref).exists() or (not ref.endswith("/") and (REPO / f"{ref}.py").is_file())


def _dangling_references() -> list[str]:
    found = []
    for top in ("labctl", "tests"):
        for path in sorted((REPO / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            for line, text in _comments_and_docstrings(path):
                for ref in file_references(text):
                    if not _exists(ref):
                        found.append(f"{path.relative_to(REPO)}:{line}: {ref}")
    return sorted(set(found), key=lambda s: (s.split(":")[0], int(s.split(":")[1]), s))


def test_the_readme_is_short_and_keeps_the_two_commands_for_a_newcomer() -> None:
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) < 300, f"README.md has {len(lines)} lines; move a guide into docs/"
    assert "make demo" in text and "make test" in text
    assert "## Two commands for a newcomer" in text


def test_every_feature_guide_is_linked_from_the_readme() -> None:
    linked = {Path(t).name for t in _relative_links(README.read_text(encoding="utf-8"))}
    pages = {p.name for p in DOCS.glob("*.md")}
    assert pages - linked == set(), f"docs pages the README does not link to: {sorted(pages - linked)}"


def test_every_relative_link_in_readme_and_docs_leads_to_a_file_that_exists() -> None:
    broken = []
    for page in _markdown_pages():
        for target in _relative_links(page.read_text(encoding="utf-8")):
            if target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)}: ({target})")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_the_link_helper_takes_relative_links_only() -> None:
    text = (
        "[a](ckpt.md) [b](../README.md#install) [c](#top) [d](https://x.org/y.md) "
        '![e](img/e.png "title")\n```\n[f](inside-a-fence.md)\n```\n'
    )
    assert _relative_links(text) == ["ckpt.md", "../README.md", "img/e.png"]


def test_the_layout_page_names_every_package_and_nothing_that_is_gone() -> None:
    named = labctl_paths(LAYOUT.read_text(encoding="utf-8"))
    missing = [p for p in _packages() if p not in named]
    assert not missing, f"docs/layout.md does not name these packages: {missing}"
    stale = sorted(p for p in named if not (REPO / p).exists())
    assert not stale, f"docs/layout.md names paths that do not exist: {stale}"


def test_every_labctl_path_the_readme_and_the_guides_name_exists() -> None:
    stale = [
        f"{page.relative_to(REPO)}: {path}"
        for page in _markdown_pages()
        for path in sorted(labctl_paths(page.read_text(encoding="utf-8")))
        if not (REPO / path).exists()
    ]
    assert not stale, "paths that do not exist (moved?):\n" + "\n".join(stale)


def test_the_layout_path_helper_reads_backticks_only() -> None:
    text = (
        "`labctl/agent/cache/` and `labctl/cli/app.py`'s table, `labctl/hosts/fanout.py` (every "
        "action), `labctl/<feature>/`, `labctl.agent.core`, labctl/not/in/backticks.py, "
        "`labctl/train/backends/__init__.py`."
    )
    assert labctl_paths(text) == {
        "labctl/agent/cache/",
        "labctl/cli/app.py",
        "labctl/hosts/fanout.py",
        "labctl/train/backends/__init__.py",
    }


def test_the_reference_helper_finds_repository_files_in_prose() -> None:
    text = (
        "see docs/benchmarks.md, the brief (OTHER.md) and labctl/agent/core/paths.py; "
        "not mylab/inventory/lab.yaml, https://example.org/README.md, tests/unit/test_*.py, "
        "labctl/agent/<feature>/, playbooks/NAME.yaml or PyTorch's RELEASE.md."
    )
    assert file_references(text) == ["docs/benchmarks.md", "OTHER.md", "labctl/agent/core/paths.py"]
    assert _exists("bench/cache_sync") and not _exists("OTHER.md")


def test_no_comment_or_docstring_points_to_a_file_the_repository_does_not_have() -> None:
    """Comments and docstrings in labctl/ and tests/ cite only files that exist, read from the
    repository root: a reader who follows one finds it."""
    found = _dangling_references()
    assert not found, "comments and docstrings citing files that do not exist:\n" + "\n".join(found)
