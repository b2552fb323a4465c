"""Issue 25, round two: the places the four classes reached beyond the files first fixed.

Shell text only from labctl/transport/shell.py; a name that becomes a path component checked by
paths.component_problem; validating patterns ASCII-only and anchored with \\Z; a user's file
cut at "\\n" only (labctl/agent/core/textedit.py). Each test feeds the input that got through.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

import paramiko
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from labctl.agent.core.errors import AgentError
from labctl.inventory.model import Host
from labctl.output.errors import InputError
from tests.unit.test_names_and_quoting import inventory, run_cli

# '0123456789' in Arabic-Indic digits: str.isdigit(), int() and an unflagged \d take them.
OTHER_DIGITS = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
# What str.splitlines() cuts at besides "\n", and spaces str.split() cuts at: none of them is a
# line or field break for ssh, cron or fstab.
ODD = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\r", "\xa0"]


# -- 1: shell text ---------------------------------------------------------------------------


def test_a_local_command_env_name_is_refused_as_input_not_a_popen_traceback() -> None:
    from labctl.transport.local import LocalConnection

    conn = LocalConnection(Host(name="here", address="127.0.0.1", connection="local"))
    for bad in ("A=B", "A;id", "1A", "A B"):
        with pytest.raises(InputError, match="not an environment variable name"):
            conn.run("true", env={bad: "1"})
    assert conn.run('printf %s "$A"', env={"A": "it's $(id)"}).stdout == "it's $(id)"


# -- 2: names that become path components ----------------------------------------------------


@pytest.mark.parametrize("bad", ["run-1\n", "run\u2028x", "run/..", "..", ".hidden", "r" * 129, ""])
def test_the_checkpoint_library_refuses_a_run_id_that_is_not_one_plain_name(bad: str) -> None:
    from labctl.agent.ckpt.library import LibraryError, check_run_id

    with pytest.raises(LibraryError):
        check_run_id(bad)
    assert check_run_id("p1-20250101.ab+c_d") == "p1-20250101.ab+c_d"


def test_the_library_lists_only_folders_it_could_have_made(tmp_path: Path) -> None:
    from labctl.agent.ckpt.library import entries

    for run in ("run1", "run2\n"):
        for step in ("step-00000001", "step-00000002\n", "step-00000003".translate(OTHER_DIGITS)):
            (tmp_path / run / step).mkdir(parents=True)
    assert [(e["run_id"], e["step"]) for e in entries(str(tmp_path))] == [("run1", 1)]


def test_checkpoint_file_names_are_ascii_digits_to_the_end(tmp_path: Path) -> None:
    from labctl.agent.train.ckpt import CheckpointDir

    odd = ["step-00000001.pt\n", "step-00000002.pt".translate(OTHER_DIGITS)]
    temps = [".step-00000003.pt.1.tmp\n", ".step-00000004.pt.1.tmp".translate(OTHER_DIGITS)]
    for name in [*odd, *temps, ".step-00000005.pt.1.tmp"]:
        (tmp_path / name).write_bytes(b"x")
    ck = CheckpointDir(str(tmp_path))
    assert ck.steps_present() == []
    assert ck.clean_temp() == [".step-00000005.pt.1.tmp"]  # a writer's own temp file only
    assert sorted(os.listdir(tmp_path)) == sorted([*odd, *temps])


@pytest.mark.parametrize("bad", ["a\u2028b", "a\nb", "a\xa0b", ".hidden", "a/b", "m" * 250])
def test_the_model_library_on_the_host_takes_the_names_cache_sync_takes(tmp_path: Path, bad: str) -> None:
    from labctl.agent.ckpt.pull import model_state_command

    with pytest.raises(AgentError) as e:
        model_state_command({"models": str(tmp_path), "name": bad})
    assert e.value.kind == "bad_name"
    assert model_state_command({"models": str(tmp_path), "name": "tinylm-ft"})["exists"] is False


@pytest.mark.parametrize(
    ("fname", "part"), [("a\nb", "ok.0"), ("a\u2028b", "ok.0"), ("model.bin", ".."), ("model.bin", "p\x85")]
)
def test_a_published_file_or_part_name_is_one_plain_name(tmp_path: Path, fname: str, part: str) -> None:
    from labctl.agent.ckpt.pull import model_publish_command

    parts = [{"name": part, "size": 1, "sha256": "0" * 64}]
    with pytest.raises(AgentError) as e:
        model_publish_command(
            {"models": str(tmp_path), "name": "m", "files": [{"name": fname, "parts": parts}]}
        )
    assert e.value.kind == "bad_args"
    assert os.listdir(tmp_path) == []


def test_ckpt_pull_refuses_a_model_name_cache_sync_would_refuse(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    rc, out = run_cli(
        "-i", str(inventory(tmp_path)), "ckpt", "pull", str(tmp_path / "src"), "--model", "a\u2028b"
    )
    assert rc == 2 and "not a model name" in out and "U+2028" in out, out


@pytest.mark.parametrize("bad", ["/srv/a\u2028b", "/srv/a\x85b", "/srv/a\xa0b", "/srv/a\u200bb"])
def test_ckpt_restore_dir_follows_the_inventory_path_rule(tmp_path: Path, bad: str) -> None:
    rc, out = run_cli("-i", str(inventory(tmp_path)), "ckpt", "restore", "run1", "--to", "a", "--dir", bad)
    assert rc == 2 and "--dir" in out and "character" in out, out


@pytest.mark.parametrize(
    "args", [("verify", "--run", "..\n"), ("restore", "run\u2028x", "--to", "a", "--dir", "/srv/x")]
)
def test_a_library_run_id_is_bad_input_before_the_storage_host_is_asked(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    rc, out = run_cli("-i", str(inventory(tmp_path)), "ckpt", *args)
    assert rc == 2 and "not a run id the library can hold" in out, out


def test_a_script_whose_name_cannot_be_a_file_on_the_host_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "train\u2028x.py"
    script.write_text("print('hi')\n")
    rc, out = run_cli(
        "-i", str(inventory(tmp_path)), "train", "--phase", "1", "--script", str(script), "--dry-run"
    )
    assert rc == 2 and "script's file name" in out and "U+2028" in out, out


# -- 3: validating patterns: ASCII digits, \Z ------------------------------------------------


def patterns() -> list[tuple[str, re.Pattern[str], str, str | None]]:
    """(what, pattern, a value it takes, that value with other digits where it reads digits)."""
    from labctl.agent.ckpt import library as ckpt_library
    from labctl.agent.cron import cronjobs
    from labctl.agent.train import ckpt
    from labctl.ckpt import pull
    from labctl.plan import spec
    from labctl.provision.resources import controller

    return [
        ("run id", ckpt_library._RUN_ID, "run-1", None),  # ASCII letters and digits by name
        ("step folder", ckpt_library._STEP_DIR, "step-00000012", "step-000000١٢"),
        ("checkpoint file", ckpt._NAME, "step-00000012.pt", "step-000000١٢.pt"),
        ("checkpoint temp", ckpt._TEMP, ".step-00000012.pt.7.tmp", ".step-000000١٢.pt.7.tmp"),
        ("pulled file", pull._STEP_FILE, "step-00000012.json", "step-000000١٢.json"),
        ("clock", spec.CLOCK, "08:30", "08:3٠"),
        ("public key", controller.KEY_RE, "ecdsa-sha2-nistp256 AAAA", "ecdsa-sha2-nistp٢٥٦ AAAA"),
        ("cron mark", cronjobs.MARK_RE, "# labctl:command: run", None),
    ]


@pytest.mark.parametrize("index", range(8))
def test_a_validating_pattern_takes_no_other_digits_and_no_trailing_newline(index: int) -> None:
    what, pattern, good, other_digits = patterns()[index]
    assert pattern.match(good), what
    assert not pattern.match(good + "\n"), what
    if other_digits is not None:
        assert not pattern.match(other_digits), what


def test_retention_reads_a_step_in_ascii_digits_only() -> None:
    from labctl.ckpt.retention import step_of

    assert step_of("run/step-00000120") == 120
    assert step_of("run/step-00000120".translate(OTHER_DIGITS)) == -1
    assert step_of("run/step-00000120\n") == -1


@pytest.mark.parametrize("bad", ["08:00\n", "08:3٠", "08:00 "])
def test_a_plan_window_time_is_hh_mm_in_ascii(bad: str) -> None:
    from labctl.plan.spec import Window

    with pytest.raises(ValidationError, match="not a time of day"):
        Window(start=bad, end="22:00")
    assert Window(start="08:00", end="24:00").end == "24:00"


def test_other_digits_name_no_gpu_cuda_build_or_architecture() -> None:
    from labctl.agent.core.gpus import arch_caps
    from labctl.agent.monitor.status import _visible_gpus
    from labctl.agent.provision.torch_env import cuda_of

    assert _visible_gpus("0,١") == [0]
    assert cuda_of("cu126") == "12.6" and cuda_of("cu١٢٦") is None
    assert arch_caps(["sm_80", "sm_٩٠"]) == ([(8, 0)], False)


def test_torch_env_reads_a_compute_capability_in_ascii_digits_only() -> None:
    from labctl.provision.resources.torch_env import TorchEnv

    res = TorchEnv.from_playbook(Host(name="m5", address="10.0.0.1"), {})
    stdout = "NVIDIA A100, 8.0\nOdd GPU, ٩.٠\n"
    assert res.found_caps({"gpus": {"stdout": stdout}}) == [("NVIDIA A100", (8, 0))]  # type: ignore[attr-defined]


def test_a_stale_partial_env_is_only_one_this_builder_named(tmp_path: Path) -> None:
    from labctl.agent.provision.torch_env import remove_stale_partials

    base = "torch-2.13.0-cu126"
    ours = f".{base}.partial-{2**22 + 7}"  # above any pid_max: its builder is gone
    theirs = [f".{base}.partial-{2**22 + 7}".translate(OTHER_DIGITS), f".{base}.old-{2**22 + 7}\n"]
    for name in [ours, *theirs]:
        (tmp_path / name).mkdir()
    assert remove_stale_partials(str(tmp_path), base) == [ours]
    assert sorted(os.listdir(tmp_path)) == sorted(theirs)


# -- 4: a user's file cut at "\n" only -------------------------------------------------------


def test_a_cron_job_command_holding_u2028_reads_back_whole() -> None:
    from labctl.agent.cron.cronjobs import parse_job_file
    from labctl.provision.resources.cron import CronParams, cron_file, systemd_units

    command = "echo a\u2028b\x85c\u2029d  e"
    p = CronParams(name="rotate", schedule="0 3 * * *", command=command, backend="cron")
    read = parse_job_file(cron_file(p))
    assert read["command"] == command and read["schedule"] == "0 3 * * *" and read["user"] == "root"
    assert command in read["line"]
    assert parse_job_file(systemd_units(p)[0])["command"] == command


def test_a_user_key_line_only_looking_like_ours_across_a_vertical_tab_is_kept(tmp_path: Path) -> None:
    from labctl.agent.provision.commands import apply_command, probe_command
    from labctl.provision.resources.controller import AuthorizedKey, AuthorizedKeyParams

    ssh = tmp_path / ".ssh"
    ssh.mkdir(mode=0o700)
    keys = ssh / "authorized_keys"
    mark = "labctl-orchestrator@pharaoh"
    before = f"ssh-rsa AAAAB3Nza joe\x0b{mark}\nssh-rsa AAAAB3Nzb ann\xa0{mark}\n".encode()
    keys.write_bytes(before)
    pub = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGc3Bvq0mV3cBXHXqkqEM0l6fIxU4oXBe7kq4X0fJq4D"
    res = AuthorizedKey(Host(name="m5", address="10.0.0.1"), AuthorizedKeyParams(mark=mark, key=pub))

    def probe(path: Path) -> dict[str, Any]:
        found = probe_command({"probes": {"f": {"kind": "file", "path": str(path), "whole": True}}})
        return dict(found["results"]["f"])

    ids = {"uid": os.getuid(), "user_gid": os.getgid(), "home": str(tmp_path)}
    apply_command(
        {
            "ops": res.plan(
                {"keys": {**ids, "ssh_dir": probe(ssh), "path": str(keys), "file": probe(keys)}}
            ).ops
        }
    )
    assert keys.read_bytes() == before + f"{pub} {mark}\n".encode()


# -- known_hosts: pinning changes the pinned host's lines only --------------------------------

NAME = "[10.0.0.9]:2222"
OLD_KEY = paramiko.ECDSAKey.generate()
NEW_KEY = paramiko.ECDSAKey.generate()
OTHER_KEY = paramiko.ECDSAKey.generate()


def key_line(host: str, key: paramiko.PKey) -> str:
    return f"{host} {key.get_name()} {key.get_base64()}"


known_hosts_line = st.one_of(
    st.text(
        alphabet=st.one_of(
            st.sampled_from(ODD), st.characters(blacklist_categories=("Cs",), blacklist_characters="\n")
        ),
        max_size=30,
    ).map(lambda t: "#" + t),  # a comment: whatever it holds, it stays one
    st.sampled_from(["", "  ", "\t"]),
    st.sampled_from(["10.0.0.9", "[10.0.0.9]:22", "[10.0.0.1]:2222", "@revoked " + NAME]).map(
        lambda h: key_line(h, OTHER_KEY)
    ),
    st.just(key_line(NAME, OLD_KEY)),
    st.just(key_line(NAME, OLD_KEY)).map(lambda line: " \t" + line),
)


@st.composite
def known_hosts_files(draw: Any) -> tuple[bytes, bytes]:
    """(a known_hosts file, the same file without the lines pinning NAME)."""
    lines = draw(st.lists(known_hosts_line, max_size=8))
    ends = [draw(st.sampled_from([b"\n", b"\r\n"])) for _ in lines]
    if lines and draw(st.booleans()):
        ends[-1] = b""
    pieces = [line.encode() + end for line, end in zip(lines, ends, strict=True)]
    ours = key_line(NAME, OLD_KEY)
    kept = [p for p, line in zip(pieces, lines, strict=True) if line.strip(" \t") != ours]
    return b"".join(pieces), b"".join(kept)


@given(known_hosts_files())
def test_pinning_a_host_changes_only_its_own_lines(files: tuple[bytes, bytes]) -> None:
    from labctl.transport.hostkeys import load_known_hosts, pin_host_key

    before, kept = files
    crlf = before.count(b"\r\n")
    nl = b"\r\n" if crlf > before.count(b"\n") - crlf else b"\n"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "known_hosts"
        path.write_bytes(before)
        pin_host_key(path, "10.0.0.9", 2222, NEW_KEY)
        closed = kept + nl if kept and not kept.endswith(b"\n") else kept
        assert path.read_bytes() == closed + key_line(NAME, NEW_KEY).encode() + nl
        assert dict(load_known_hosts(path).lookup(NAME) or {}) == {NEW_KEY.get_name(): NEW_KEY}


def test_a_known_hosts_comment_holding_u2028_or_a_lone_cr_pins_nothing(tmp_path: Path) -> None:
    from labctl.transport.hostkeys import load_known_hosts, pin_host_key

    path = tmp_path / "known_hosts"
    before = (
        f"# moved from the old laptop:\u2028{key_line('evil', OTHER_KEY)}\n"
        f"# and\r{key_line('worse', OTHER_KEY)}\n"
        f"{NAME},10.0.0.1 {OLD_KEY.get_name()} {OLD_KEY.get_base64()}\n"
    ).encode()
    path.write_bytes(before)
    keys = load_known_hosts(path)
    assert keys.lookup("evil") is None and keys.lookup("worse") is None
    pin_host_key(path, "10.0.0.9", 2222, NEW_KEY)
    after = path.read_bytes().split(b"\n")
    assert after[:2] == before.split(b"\n")[:2]  # the comments, byte for byte
    assert after[2] == key_line("10.0.0.1", OLD_KEY).encode()  # the other host keeps its pin
    keys = load_known_hosts(path)
    assert keys.lookup("evil") is None and dict(keys.lookup("10.0.0.1") or {}) == {
        OLD_KEY.get_name(): OLD_KEY
    }


def test_a_bad_known_hosts_line_is_named_by_the_number_sed_deletes(tmp_path: Path) -> None:
    from labctl.transport.localfiles import known_hosts_problem

    path = tmp_path / "known_hosts"
    path.write_text(f"# a\u2028b\x85c\n{key_line('10.0.0.1', OTHER_KEY)}\nbroken line\n")
    problem = known_hosts_problem(path)
    assert problem is not None and "line 3 " in problem[0] and "sed -i '3d'" in problem[1]


def test_the_orchestrators_known_hosts_copy_keeps_a_comment_one_line(tmp_path: Path) -> None:
    from labctl.cron.plan import known_hosts_copy

    path = tmp_path / "known_hosts"
    comment = f"# moved:\u2028{key_line('evil', OTHER_KEY)}"
    path.write_text(f"{comment}\r\n{key_line('10.0.0.1', OTHER_KEY)}\n")
    text = known_hosts_copy([Host(name="m5", address="10.0.0.1", known_hosts=path)])
    assert text.split("\n") == [comment, key_line("10.0.0.1", OTHER_KEY), ""]
    path.write_bytes(b"# ok\n# caf\xe9\n")
    with pytest.raises(InputError, match="line 2 is not UTF-8"):
        known_hosts_copy([Host(name="m5", address="10.0.0.1", known_hosts=path)])


def test_a_playbook_copied_to_the_orchestrator_has_a_plain_name_and_text(tmp_path: Path) -> None:
    from labctl.cron.plan import playbook_files

    books = tmp_path / "lab" / "playbooks"
    books.mkdir(parents=True)
    (books / "site.yaml").write_text("plays: []\n")
    inv = tmp_path / "lab" / "inv.yaml"
    assert playbook_files(inv) == {"site.yaml": "plays: []\n"}
    (books / "odd\u2028name.yaml").write_text("plays: []\n")
    with pytest.raises(InputError, match="U\\+2028"):
        playbook_files(inv)
    (books / "odd\u2028name.yaml").unlink()
    (books / "latin1.yaml").write_bytes(b"# caf\xe9\n")
    with pytest.raises(InputError, match="not UTF-8"):
        playbook_files(inv)


# -- paths in the inventory -----------------------------------------------------------------


@pytest.mark.parametrize("bad", ["\u2028", "\u2029", "\x85", "\xa0", "\u200b", "\u202e", "\x7f"])
def test_a_host_path_with_an_invisible_or_line_breaking_character_is_refused(
    tmp_path: Path, bad: str
) -> None:
    from labctl.inventory.load import load_inventory

    text = f'lab: t\ndefaults: {{connection: local}}\nhosts:\n  b:\n    address: 10.0.0.2\n    storage: {{models: "/srv/mod{bad}els"}}\n'
    path = tmp_path / "inv.yaml"
    path.write_text(text.replace(bad, f"\\u{ord(bad):04x}"))  # YAML's escape: the file stays one line
    with pytest.raises(InputError) as e:
        load_inventory(path)
    assert e.value.exit_code == 2 and "storage.models" in e.value.message, e.value.message


def test_a_host_path_keeps_letters_of_any_script(tmp_path: Path) -> None:
    from labctl.inventory.load import load_inventory

    path = tmp_path / "inv.yaml"
    path.write_text(
        'lab: t\ndefaults: {connection: local}\nhosts:\n  b:\n    address: 10.0.0.2\n    storage: {models: "/srv/modèles/été 2025"}\n'
    )
    assert load_inventory(path).hosts["b"].storage.models == "/srv/modèles/été 2025"  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", ["a\u2028b", "a\x85b", "a\xa0b"])
def test_a_path_component_refuses_what_a_host_path_refuses(bad: str) -> None:
    from labctl.documents.validation import path_component

    with pytest.raises(InputError) as e:
        path_component(bad, "The run id", "p1")
    assert e.value.exit_code == 2
