"""Phase 3's sample per step (issue 39, point 12): which try it shows, its bounds, where it is
written on the host and here, `labctl train show RUN --samples`, and the step line's hint when
the reward is 0."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from labctl.agent.models.tasks import TASKS
from labctl.agent.orchestra.client import Answer
from labctl.agent.train.events import EventLog
from labctl.agent.train.metrics import Metrics
from labctl.agent.train.phase3 import SAMPLE_OUTPUT_BYTES, SAMPLE_PROGRAM_BYTES, Phase3
from labctl.agent.train.settings import resolve_rl
from tests.unit.test_ux import run_cli

TRACEBACK = 'Traceback (most recent call last):\n  File "/work/main.py", line 1\nNameError: name "x"\n'


class Lab:
    """Models answer with `programs[model]` (None: the answer failed); the sandbox runs a program
    as its task's reference solution passes, anything else exits 1 with a traceback on stderr."""

    def __init__(self, programs: dict[str, str | None], sandbox_error: str | None = None) -> None:
        self.programs = programs
        self.sandbox_error = sandbox_error

    def ask(self, endpoints: list[str], prompt: str, **kw: Any) -> list[Answer]:
        out = []
        for e in endpoints:
            a = Answer(e)
            a.text, a.latency_s, a.finish_reason = self.programs[e], 0.1, "stop"
            if a.text is None:
                a.error, a.kind = "HTTP 500: the model server fell over", "http"
            out.append(a)
        return out

    def run(self, programs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for p in programs:
            if self.sandbox_error:
                out.append(
                    {"lang": "python", "error": self.sandbox_error, "tests": [], "passed": 0, "total": 1}
                )
                continue
            ok = any(p["source"] == t.solution for t in TASKS)
            tests = [
                {
                    "ok": ok,
                    "exit_code": 0 if ok else 1,
                    "timed_out": False,
                    "stdout": f"out {i}\n" if ok else "",
                    "stderr": "" if ok else TRACEBACK + "x" * 5000,
                }
                for i, _ in enumerate(p["tests"])
            ]
            out.append(
                {
                    "lang": "python",
                    "stage": "run",
                    "tests": tests,
                    "passed": len(tests) * ok,
                    "total": len(tests),
                }
            )
        return out


def phase3(lab: Lab, models: list[str], **rl: Any) -> Phase3:
    return Phase3(resolve_rl(rl) or {}, endpoints=lambda: models, ask=lab.ask, run=lab.run)


def context(prompt: list[int], n: int) -> list[int]:
    return [ord("a")] * n


def test_the_sample_is_the_try_that_passed_least_with_its_program_and_output_bounded() -> None:
    bad = "import sys\n" + "# padding\n" * 1000  # 10 KB of program
    lab = Lab({"good": f"```python\n{TASKS[0].solution}```\n", "bad": f"```python\n{bad}```\n"})
    p3 = phase3(lab, ["good", "bad"], tasks_per_step=1)
    p3.rollouts(1, context, 64)
    s = p3.sample
    assert s is not None
    # "good" passed and came first; the sample is the program that passed nothing: it says why.
    assert (s["step"], s["rank"], s["task"], s["model"]) == (1, 0, TASKS[0].name, "bad")
    assert s["passed"] == 0 and s["total"] == len(TASKS[0].tests) and s["exit_code"] == 1
    assert s["timed_out"] is False and s["stderr"].startswith(TRACEBACK)
    assert len(s["program"].encode()) <= SAMPLE_PROGRAM_BYTES + 40 and s["program"].startswith("import sys")
    assert (
        s["program_bytes"] == len(bad.encode())
        and f"{len(bad.encode()) - SAMPLE_PROGRAM_BYTES} more bytes" in s["program"]
    )
    assert len(s["stderr"].encode()) <= SAMPLE_OUTPUT_BYTES + 40
    assert len(json.dumps(s)) < 8000  # a line of samples.jsonl stays a few KB

    # Everything passed: the first judged try, its first test's output.
    lab.programs["bad"] = lab.programs["good"]
    p3.rollouts(2, context, 64)
    assert p3.sample is not None
    assert (p3.sample["step"], p3.sample["model"], p3.sample["exit_code"]) == (2, "good", 0)
    assert p3.sample["stdout"] == "out 0\n" and p3.sample["passed"] == p3.sample["total"]


def test_with_nothing_judged_the_sample_says_what_the_sandbox_or_the_model_said() -> None:
    lab = Lab({"bad": "print(1)"}, sandbox_error="no image for python: run `labctl sandbox images`")
    p3 = phase3(lab, ["bad"])
    p3.rollouts(1, context, 64)
    assert p3.sample is not None and p3.sample["error"].startswith("no image for python")
    assert p3.sample["program"] == "print(1)" and "passed" not in p3.sample
    lab = Lab({"down": None})
    p3 = phase3(lab, ["down"])
    p3.rollouts(1, context, 64)
    assert p3.sample == {
        "step": 1,
        "rank": 0,
        "task": TASKS[0].name,
        "model": "down",
        "error": "HTTP 500: the model server fell over",
    }


def test_rank_0_writes_its_sample_beside_the_metrics_and_on_stdout_not_in_the_metrics(tmp_path: Path) -> None:
    out = io.StringIO()
    metrics = Metrics(out, active=True, steps=3, restart=0)
    metrics.events.open(str(tmp_path / "run" / "metrics.jsonl"))
    metrics.sample({"step": 1, "model": "bad", "program": "print("})
    metrics.emit({"event": "step", "step": 1})
    metrics.events.close()
    (line,) = (tmp_path / "run" / "samples.jsonl").read_text().splitlines()
    assert json.loads(line) == {"event": "sample", "step": 1, "model": "bad", "program": "print("}
    assert json.loads(out.getvalue().splitlines()[0])["event"] == "sample"  # the controller's copy
    assert "sample" not in (tmp_path / "run" / "metrics.jsonl").read_text()
    other = io.StringIO()
    quiet = EventLog(other, active=False)
    quiet.open(str(tmp_path / "rank1" / "metrics.jsonl"))
    quiet.sample({"step": 1})
    assert other.getvalue() == "" and not (tmp_path / "rank1").exists()


def test_the_controller_keeps_rank_0s_samples_apart_and_does_not_print_them(tmp_path: Path) -> None:
    from labctl.output.progress import Shown
    from labctl.train.launch import Stream

    shown: list[str] = []
    stream = Stream(
        tmp_path / "p3-run", {0}, Shown(None, {"line": lambda _c, label, text, stream: shown.append(text)})
    )
    stream.open(["m5"])
    stream.line("m5", "stdout", '[rank0]:{"event": "sample", "step": 2, "model": "bad"}')
    stream.line("m5", "stdout", '[rank0]:{"event": "step", "step": 2, "steps": 3, "loss": 1.0}')
    stream.close()
    (kept,) = (tmp_path / "p3-run" / "samples.jsonl").read_text().splitlines()
    assert json.loads(kept) == {"event": "sample", "step": 2, "model": "bad", "host": "m5"}
    assert "sample" not in (tmp_path / "p3-run" / "metrics.jsonl").read_text()
    assert [e["event"] for e in stream.events] == ["step"] and len(shown) == 1 and "sample" not in shown[0]


def step_event(**kw: Any) -> dict[str, Any]:
    base = {"event": "step", "step": 2, "steps": 3, "loss": 5.0, "lr": 1e-3, "tokens_per_s": 100}
    return {**base, "reward": 0.0, "exec_success_rate": 0.0, "programs_run": 3, "orchestra_ms": {}, **kw}


def test_a_zero_reward_says_whether_any_program_ran_and_where_to_look() -> None:
    from labctl.train.launch import format_event

    line = format_event(step_event(), "p3-20260101-000000-ab12")
    assert "reward 0.000" in line
    assert "0 of 3 programs ran: see `labctl train show p3-20260101-000000-ab12 --samples`" in line
    ran = format_event(step_event(exec_success_rate=0.5, programs_run=1), "p3-x")
    assert "no test passed: see `labctl train show p3-x --samples`" in ran and "programs ran" not in ran
    assert "RUN --samples" in format_event(step_event())  # no run named: the placeholder
    # A reward above 0, or a step that ran nothing (nothing judged), has no such hint.
    assert "--samples" not in format_event(step_event(reward=0.25, exec_success_rate=0.5))
    assert "--samples" not in format_event(step_event(reward=None, programs_run=0))


def test_train_show_samples_prints_the_program_and_how_it_ran(tmp_path: Path) -> None:
    lab = tmp_path / "lab"
    assert run_cli("init", str(lab)).returncode == 0
    inv = lab / "inventory" / "lab.yaml"
    run_id = "p3-20260101-000000-ab12"
    folder = lab / "inventory" / ".labctl" / "runs" / run_id
    folder.mkdir(parents=True)
    record = {
        "run_id": run_id,
        "phase": 3,
        "hosts": ["m5"],
        "state": "done",
        "log_dir": "/var/lib/labctl/runs/x",
    }
    (folder / "run.json").write_text(json.dumps(record))
    (folder / "metrics.jsonl").write_text(json.dumps(step_event(step=3)) + "\n")
    samples = [
        {
            "event": "sample",
            "step": s,
            "rank": 0,
            "task": "sum_two",
            "model": "demo-a",
            "program": f"print(x{s})",
            "program_bytes": 9,
            "cut": False,
            "passed": 0,
            "total": 5,
            "stage": "run",
            "exit_code": 1,
            "timed_out": False,
            "stdout": "",
            "stderr": f"NameError: name 'x{s}' is not defined\n",
        }
        for s in (1, 2, 3)
    ]
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples) + '{"cut off')
    proc = run_cli("-i", str(inv), "train", "show", run_id, "--samples", "-n", "2")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout + proc.stderr
    assert (
        "step 2: sum_two by demo-a" in text and "step 3: sum_two by demo-a" in text and "step 1:" not in text
    )
    assert "passed 0 of 5 tests; the first test exited 1" in text
    assert "    print(x3)" in text and "  stderr:\n    NameError: name 'x3' is not defined" in text
    assert f"0 of 3 programs ran: see `labctl train show {run_id} --samples`" in text
    js = run_cli("--json", "-i", str(inv), "train", "show", run_id, "--samples")
    assert [s["step"] for s in json.loads(js.stdout)["samples"]] == [1, 2, 3]
    # A run with no samples here says where a detached run keeps them.
    (folder / "samples.jsonl").unlink()
    none = run_cli("-i", str(inv), "train", "show", run_id, "--samples")
    assert (
        none.returncode == 2
        and "labctl exec -l m5 -- tail -n 3 /var/lib/labctl/runs/x/samples.jsonl" in none.stderr
    )
    assert "Traceback" not in none.stderr


def test_the_trainer_keeps_a_sample_of_every_step_in_the_runs_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    from tests.unit.test_train_phase3 import Lab as Models
    from tests.unit.test_train_phase3 import rl_trainer

    models = Models()
    models.endpoints = [["bad"]]  # a program that prints nothing: a reward of 0 to explain
    t = rl_trainer(monkeypatch, models, steps=2, metrics_path=str(tmp_path / "run" / "metrics.jsonl"))
    try:
        t.run()
    finally:
        t.close()
    kept = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    assert [(s["event"], s["step"], s["model"], s["passed"]) for s in kept] == [
        ("sample", 1, "bad", 0),
        ("sample", 2, "bad", 0),
    ]
    assert kept[0]["program"] == "print()"
    streamed = [json.loads(line) for line in t.out.getvalue().splitlines()]
    assert [e["step"] for e in streamed if e["event"] == "sample"] == [1, 2]
