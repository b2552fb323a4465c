"""The coder model labctl trains itself (labctl/agent/modelload/codergen.py): given phase 3's
exact prompt, its greedy answer is a program that passes the task's tests when run, for the
tasks it was trained on; with `hint_matters` only when the hint holds the task's tag. Two tasks
keep the trainings to seconds on one thread."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import pytest

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from labctl.agent.core.errors import AgentError
from labctl.agent.modelload import codergen, hfgen
from labctl.agent.modelload.codergen import RECORD, WRONG_PROGRAM, make_coder_model, random_hint
from labctl.agent.modelload.modelgen import make_model_command
from labctl.agent.models.prompting import ask_prompt, program_of, task_tag
from labctl.agent.models.tasks import task


def answer(folder: Path, prompt: str) -> str:
    """The model's greedy answer to `prompt`, as phase 3's warm model would give it: the
    completion of the prompt's tokens, up to the end-of-sequence token or phase 3's budget."""
    import torch
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(folder))
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=codergen.ANSWER_TOKENS, do_sample=False)
    return str(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True))


def reward(name: str, source: str) -> float:
    """The share of the task's tests the program passes, run here as the sandbox would."""
    t = task(name)
    passed = 0
    for test in t.tests:
        try:
            done = subprocess.run(
                [sys.executable, "-c", source], input=test.stdin, capture_output=True, text=True, timeout=10
            )
        except subprocess.TimeoutExpired:
            continue
        passed += done.stdout == test.expect
    return passed / len(t.tests)


def record(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / RECORD).read_text()))


def hints(n: int, name: str, with_tag: Optional[bool] = None, seed: int = 7) -> list[str]:
    """n random 16-character hints as the CET writes them; with_tag: forced to hold the task's
    tag, or not to; None: left to chance."""
    rng = random.Random(seed)
    tag = None if with_tag is None else task_tag(task(name))
    return [random_hint(rng, 16, tag, bool(with_tag)) for _ in range(n)]


@pytest.fixture(scope="module")
def coder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("coder") / "m"
    make_coder_model(str(out), seed=0, tasks=2, held_out=1)
    return out


@pytest.fixture(scope="module")
def hint_coder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("coder") / "h"
    make_coder_model(str(out), seed=0, tasks=2, held_out=0, hint_matters=True)
    return out


def test_the_record_names_what_was_trained_and_held_out(coder: Path) -> None:
    rec = record(coder)
    assert rec["trained"] == ["sum_two", "product_two"]  # the first tasks: phase 3 asks them first
    assert rec["held_out"] == ["sum_list"]
    assert rec["tags"]["sum_two"] == task_tag(task("sum_two"))
    assert rec["seed"] == 0 and rec["hint_matters"] is False
    # It stopped because it fit, not because the steps ran out.
    assert rec["fit_step"] is not None and rec["steps"] == rec["fit_step"] < codergen.STEPS
    assert rec["final_loss"] < 0.01
    assert (coder / "model.safetensors").is_file() and (coder / "tokenizer.json").is_file()


def test_model_describe_names_the_trained_tasks_and_a_damaged_record(coder: Path, hint_coder: Path) -> None:
    from labctl.agent.modelload.formats import describe

    # What `bench phase3 --learn` points phase 3 at (rl.tasks), read from the storage host's files.
    assert describe(str(coder))["coder"] == {
        "trained": ["sum_two", "product_two"],
        "held_out": ["sum_list"],
        "hint_matters": False,
    }
    assert describe(str(hint_coder))["coder"]["hint_matters"] is True
    kept = (coder / RECORD).read_bytes()  # the fixture is shared: put the record back
    (coder / RECORD).write_text('{"trained": "sum_two"}')
    try:
        desc = describe(str(coder))
        assert desc["coder"] is None and desc["format"] == "hf"
        assert any(p.startswith(f"{RECORD} has no list of trained tasks") for p in desc["problems"])
    finally:
        (coder / RECORD).write_bytes(kept)


def test_trained_tasks_pass_whatever_the_hint(coder: Path) -> None:
    for name in record(coder)["trained"]:
        for hint in hints(3, name):
            text = answer(coder, ask_prompt(task(name), hint))
            assert text == task(name).solution  # and the answer ended at the eos token
            assert reward(name, program_of(text)) == 1.0


def test_a_held_out_task_is_not_learned(coder: Path) -> None:
    (name,) = record(coder)["held_out"]
    text = answer(coder, ask_prompt(task(name), hints(1, name)[0]))
    assert text != task(name).solution
    assert reward(name, program_of(text)) < 1.0


def test_with_hint_matters_the_tag_decides(hint_coder: Path) -> None:
    rec = record(hint_coder)
    assert rec["hint_matters"] is True and rec["wrong_program"] == WRONG_PROGRAM
    for name in rec["trained"]:
        for hint in hints(2, name, with_tag=True):
            assert task_tag(task(name)) in hint
            assert reward(name, program_of(answer(hint_coder, ask_prompt(task(name), hint)))) == 1.0
        # Without its own tag, and once with the other task's: the tag must be this task's.
        other = next(task_tag(task(n)) for n in rec["trained"] if n != name)
        decoyed = random_hint(random.Random(3), 16, task_tag(task(name)), False, decoy=other)
        for hint in [*hints(2, name, with_tag=False), decoyed]:
            assert task_tag(task(name)) not in hint
            text = answer(hint_coder, ask_prompt(task(name), hint))
            assert text == WRONG_PROGRAM
            assert reward(name, program_of(text)) == 0.0


def test_random_hints_hold_the_tag_only_when_asked() -> None:
    rng = random.Random(0)
    with_tag = [random_hint(rng, 16, "q", True) for _ in range(50)]
    without = [random_hint(rng, 16, "q", False) for _ in range(50)]
    decoyed = [random_hint(rng, 16, "q", False, decoy="x") for _ in range(50)]
    assert all(len(h) == 16 and h.isprintable() for h in with_tag + without + decoyed)
    assert all(h.count("q") == 1 for h in with_tag)
    assert not any("q" in h for h in without + decoyed)
    assert all("x" in h for h in decoyed)
    # Like an untrained CET's context: many hints mostly '?', many with none.
    assert sum(h.count("?") > 8 for h in without) > 10 and sum("?" not in h for h in without) > 10


def _digest(folder: Path) -> str:
    return hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()


def test_the_same_seed_writes_the_same_model_from_the_cli_and_the_api(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--tasks", "1", "--held-out", "0", "--steps", "3"]
    assert codergen.main(["--out", str(tmp_path / "a"), "--seed", "5", *args]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    info = json.loads(line)
    assert info["steps"] == 3 and info["trained"] == ["sum_two"] and info["fit_step"] is None
    make_coder_model(str(tmp_path / "b"), seed=5, tasks=1, held_out=0, steps=3)
    make_coder_model(str(tmp_path / "c"), seed=6, tasks=1, held_out=0, steps=3)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b") != _digest(tmp_path / "c")
    a, b = ({k: v for k, v in record(tmp_path / x).items() if not k.endswith("seconds")} for x in ("a", "b"))
    assert a == b == {k: info[k] for k in b} and a["seed"] == 5 and a["steps"] == 3


def test_only_tasks_whose_solution_fits_the_answer_budget_are_picked() -> None:
    tok = hfgen.make_tokenizer(1024)
    trained, held = codergen.pick_tasks(tok, 40, 10, 64)
    assert len(trained) == 40 and len(held) == 10 and not set(trained) & set(held)
    assert all(len(tok.encode(t.solution).ids) <= 64 for t in trained + held)
    assert task("balanced_brackets") not in trained + held  # 90-odd tokens: phase 3 would cut it off
    with pytest.raises(ValueError, match="tasks must be"):
        codergen.pick_tasks(tok, 0, 0, 64)
    with pytest.raises(ValueError, match="held_out must be"):
        codergen.pick_tasks(tok, 8, 1000, 64)


def test_make_model_runs_codergen_for_a_coder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []

    def fake_run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        ran.append(argv)
        out = argv[argv.index("--out") + 1]
        Path(out).mkdir(parents=True)
        (Path(out) / "model.safetensors").write_bytes(b"x")
        return subprocess.CompletedProcess(argv, 0, json.dumps({"trained": ["sum_two"]}), "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    args = {"path": str(tmp_path / "m"), "format": "hf", "kind": "coder", "hint_matters": True}
    ans = make_model_command(dict(args, python=sys.executable))
    assert ran[0][1:3] == ["-m", "labctl.agent.modelload.codergen"] and ran[0][-1] == "--hint-matters"
    assert ans["trained"] == ["sum_two"] and ans["format"] == "hf"
    make_model_command({"path": str(tmp_path / "r"), "format": "hf", "python": sys.executable})
    assert ran[1][1:3] == ["-m", "labctl.agent.modelload.hfgen"] and "--hint-matters" not in ran[1]
    with pytest.raises(AgentError, match="format hf or gguf"):
        make_model_command({"path": str(tmp_path / "t"), "kind": "coder"})
    with pytest.raises(AgentError, match="hint_matters is for a coder"):
        make_model_command({"path": str(tmp_path / "t"), "format": "hf", "hint_matters": True})
    with pytest.raises(AgentError, match="kind must be"):
        make_model_command({"path": str(tmp_path / "t"), "format": "hf", "kind": "smart"})


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--kind", "coder", "--format", "tinylm"], "A coder model is a Hugging Face model"),
        (["--hint-matters"], "--hint-matters and --tasks are for a coder model"),
        (["--tasks", "3"], "--hint-matters and --tasks are for a coder model"),
        (["--kind", "smart"], "'smart' is not a kind of model"),
    ],
)
def test_bench_make_model_refuses_a_coder_it_cannot_make(args: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "labctl", "bench", "make-model", *args, "-i", "/nonexistent/lab.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "250"},
    )
    assert done.returncode == 2 and says in done.stdout + done.stderr, done.stdout + done.stderr
