"""The `sandbox` resource on this machine (a `connection: local` host: the sim's namespaces
have no route to Debian's mirror): real dockerd, real debootstrap, real `docker import`.

The machine's dockerd is shared with other test sessions, so the playbook says
`configure_daemon: false` (daemon.json and restarts are covered as plans in
tests/unit/test_sandbox_images.py) and only labctl's own images are touched.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.sandbox import LABEL_LANG, LABEL_RECIPE, image_name
from labctl.agent.sandbox.languages import RECIPES, recipe_hash
from tests.conftest import ON_THIS_MACHINE, docker_unavailable, labctl

pytestmark = [pytest.mark.integration, ON_THIS_MACHINE]
STALE = "0000000000000000"


def docker(
    *args: str, check: bool = True, timeout: float = 120, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, input=stdin)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def labels(lang: str) -> dict[str, str]:
    out = docker("image", "inspect", "--format", "{{json .Config.Labels}}", image_name(lang)).stdout
    return dict(json.loads(out))


def image_id(lang: str) -> str:
    return docker("image", "inspect", "--format", "{{.Id}}", image_name(lang)).stdout.strip()


@pytest.fixture
def local_lab(tmp_path: Path) -> tuple[Path, Path]:
    reason = docker_unavailable()
    if reason:
        pytest.skip(f"Docker sandboxes unavailable: {reason}")
    inv = tmp_path / "inventory.yaml"
    inv.write_text(
        "lab: local\nhosts:\n"
        f"  here: {{address: 127.0.0.1, connection: local, python: {sys.executable},"
        " sandbox: {languages: [python, c]}}\n"
    )
    pb = tmp_path / "sandbox.yaml"
    pb.write_text(
        "name: sandbox here\nplays:\n  - name: images\n    hosts: all\n    resources:\n"
        "      - sandbox: {configure_daemon: false}\n"
    )
    return inv, pb


def provision(inv: Path, pb: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    proc = labctl("--json", "-i", str(inv), "provision", "-p", str(pb), *extra, timeout=1800)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def sandbox_result(doc: dict[str, Any]) -> dict[str, Any]:
    (r,) = [r for r in doc["results"] if r["type"] == "sandbox"]
    return dict(r)


@contextmanager
def stale_label(lang: str) -> Iterator[str]:
    """`lang`'s image replaced by the same files labelled with another recipe, as after a
    recipe change; the original put back afterwards unless something rebuilt it meanwhile."""
    original = image_id(lang)
    box = docker("create", image_name(lang), "true").stdout.strip()
    try:
        docker("commit", "--change", f"LABEL {LABEL_RECIPE}={STALE}", box, image_name(lang))
    finally:
        docker("rm", box)
    try:
        yield original
    finally:
        if labels(lang).get(LABEL_RECIPE) == STALE:
            stale = image_id(lang)
            docker("tag", original, image_name(lang))
            docker("image", "rm", stale, check=False)
        else:  # rebuilt: the original is dangling now; one a container still runs stays
            docker("image", "rm", original, check=False)


def test_provision_builds_labelled_images_that_run_then_changes_nothing(local_lab: tuple[Path, Path]) -> None:
    inv, pb = local_lab
    rc, doc = provision(inv, pb)
    r = sandbox_result(doc)
    assert rc == 0 and r["status"] in ("ok", "changed"), r
    for lang in ("python", "c"):
        assert labels(lang) == {LABEL_RECIPE: recipe_hash(RECIPES[lang]), LABEL_LANG: lang}
    ran = docker("run", "--rm", "--network", "none", image_name("python"), "python3", "-c", "print(1)")
    assert ran.stdout == "1\n"
    c = RECIPES["c"]
    # the recipe's own steps, as the pool runs them: source in /work, compile, run
    script = f"cd /work && cat > {c.file} && {' '.join(c.compile or ())} && {' '.join(c.run)}"
    ran = docker("run", "--rm", "-i", "--network", "none", image_name("c"), "sh", "-c", script, stdin=c.hello)
    assert ran.stdout == "hello\n", ran.stderr

    rc, doc = provision(inv, pb)
    r = sandbox_result(doc)
    assert rc == 0 and r["status"] == "ok" and not r["changed"] and r["summary"] == [], r


def test_check_after_a_recipe_change_reports_the_rebuild_and_provision_does_it(
    local_lab: tuple[Path, Path], docker_images: dict[str, Any]
) -> None:
    inv, pb = local_lab
    want = recipe_hash(RECIPES["c"])
    with stale_label("c"):
        stale = image_id("c")
        rc, doc = provision(inv, pb, "--check")
        r = sandbox_result(doc)
        assert rc == 0 and doc["check"] is True and r["status"] == "changed", r
        assert r["summary"] == [f"rebuild {image_name('c')} (recipe {STALE} -> {want})"]
        assert image_id("c") == stale  # --check changed nothing

        rc, doc = provision(inv, pb)
        r = sandbox_result(doc)
        assert rc == 0 and r["status"] == "changed", r
        assert labels("c") == {LABEL_RECIPE: want, LABEL_LANG: "c"}
        assert image_id("c") != stale
        # the stale image is gone, unless a container (another session's pool) still runs it
        if docker("image", "inspect", stale, check=False).returncode == 0:
            assert docker("ps", "-aq", "--filter", f"ancestor={stale}").stdout.strip()
    assert labels("python")[LABEL_RECIPE] == recipe_hash(RECIPES["python"])
