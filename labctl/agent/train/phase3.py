"""Phase 3's loop: the CET writes a context for a task, every warm model writes a program from
it, the sandbox service runs the programs against the task's tests, and the pass rate is the
reward that teaches the CET (REINFORCE over the context's tokens; the language-modelling loss
keeps training beside it).

One step: `tasks_per_step` tasks (tasks/, or the ones `tasks` names, taken in turn; each rank its own); per task the CET
reads its view of the task (`cet_prompt`: the instruction line every task shares first, then
the task's name and statement, so the context follows the statement) and samples
`group_size` contexts of `context_tokens` bytes at `temperature`; the warm set (re-read from
the orchestra's endpoints file every step, so it follows a rotation) answers the models'
prompt (prompting.ask_prompt: the statement, then the context as a hint) of every context at
once (client.ask_all, which asks another model for a request a rotation cut off); all the
programs go to the sandbox in one batch. A step never fails for a rotation: an empty warm set
is waited for (up to `wait_s`) and the time is counted as the step's rotation wait; an answer
that failed, or a program the sandbox could not run (its result carries an "error"), is left
out of the reward, not counted as zero, and counted (`answers_failed`, `sandbox_errors`); an
answer cut at `answer_tokens` is run and counted (`answers_cut`). `max_unjudged_steps` steps in
a row with nothing judged stop the run, with what went wrong.

The advantage of a judged context is its reward minus a baseline: with `group_size` 1 the
task's own moving average of its rewards (`baseline_decay`), which starts from the run's moving
average over all tasks (0 before anything is judged), with more the mean reward of its group (the task's contexts of the
step; GRPO-style). The policy gradient takes the contexts' log-probabilities at the temperature
they were sampled at (`policy_loss(..., temperature)`).

A remote tier of the endpoints file is asked for its `share` of the tries (chosen by hashing the
try's name, so the same tries on a resumed step) and for none once this host's spend on it this
month reached its `budget_per_month` (agent/orchestra/spend.py keeps the spend across runs); each
step event says what each tier was asked (`remote_asked`), what its answers cost
(`remote_spend_usd`), which tier its budget kept out and why (`remote_skipped`), and spend the
ledger could not count (`remote_ledger_errors`).

torch is imported inside the functions that use it (sample_context, rl_batch, policy_loss);
Python 3.8, like the rest of the agent.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..models.prompting import ask_prompt, cet_prompt, context_text, longest_cet_prompt, program_of
from ..orchestra.spend import RemoteUse
from .settings import TrainerError

__all__ = [
    "Phase3",
    "Rollout",
    "cet_prompt",
    "context_text",
    "longest_cet_prompt",
    "policy_loss",
    "program_of",
    "rl_batch",
    "sample_context",
]

ASK_WORKERS = 32  # the most contexts asked at once (each one asks every warm model)
# A step's sample (samples.jsonl) is read by a person: a program and its output past these sizes
# tell no more, and a run of thousands of steps keeps its samples file small.
SAMPLE_PROGRAM_BYTES = 4096
SAMPLE_OUTPUT_BYTES = 2048


def percentile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100.0 * (len(s) - 1)))] if s else 0.0


class Rollout:
    """One try at a task: the prompt and context token ids, the answers, the programs' results.
    `group`: the task's place in its step; the tries of one group share their task and prompt."""

    def __init__(self, task: Any, prompt_ids: List[int], context_ids: List[int], group: int = 0) -> None:
        self.task = task
        self.prompt_ids = prompt_ids
        self.context_ids = context_ids
        self.group = group
        self.answers: List[Any] = []
        self.results: List[Dict[str, Any]] = []
        self.reward: Optional[float] = None  # None: no answer came back to judge
        self.baseline: Optional[float] = None  # what the reward was measured against
        self.advantage = 0.0


class Window:
    """What the step events report, gathered since the last one."""

    def __init__(self) -> None:
        self.latency: Dict[str, List[float]] = {}
        self.rewards: List[float] = []
        self.executions = 0
        self.executions_ok = 0
        self.rotation_wait_s = 0.0
        self.answers_failed = 0
        self.answer_errors: Dict[str, str] = {}  # model -> its last error: why answers failed
        self.answers_retried = 0
        self.answers_cut = 0  # answers that stopped at answer_tokens (finish_reason "length")
        self.sandbox_errors = 0  # failed service calls, and programs whose result carries an "error"
        self.policy_losses: List[float] = []
        self.baselines: List[float] = []  # the baseline each judged try's advantage was taken from
        self.tries = 0  # contexts sampled
        self.tries_judged = 0  # ... and judged (a reward)
        self.programs_run = 0  # distinct programs sent to the sandbox (a repeated one runs once)
        self.unjudged_steps = 0  # steps in a row, up to the last, with nothing judged
        self.remote_asked: Dict[str, int] = {}  # remote tier -> tries it was asked for
        self.remote_spend: Dict[str, float] = {}  # remote tier -> dollars its answers cost
        self.remote_skipped: Dict[str, str] = {}  # remote tier -> why it was not asked (its budget)
        self.remote_errors: Dict[str, str] = {}  # remote tier -> why its spend was not counted

    def add_remote(self, used: Dict[str, Any]) -> None:
        """A step's RemoteUse.flush()."""
        for tier, n in used["asked"].items():
            self.remote_asked[tier] = self.remote_asked.get(tier, 0) + n
        for tier, usd in used["spend_usd"].items():
            self.remote_spend[tier] = self.remote_spend.get(tier, 0.0) + usd
        self.remote_skipped.update(used["skipped"])
        self.remote_errors.update(used["errors"])

    def flush(self) -> Dict[str, Any]:
        out = {
            "reward": round(sum(self.rewards) / len(self.rewards), 4) if self.rewards else None,
            "baseline": round(sum(self.baselines) / len(self.baselines), 4) if self.baselines else None,
            "tries": self.tries,
            "tries_judged": self.tries_judged,
            "programs_run": self.programs_run,
            "unjudged_steps": self.unjudged_steps,
            "exec_success_rate": round(self.executions_ok / self.executions, 4) if self.executions else None,
            "executions": self.executions,
            "orchestra_ms": {
                name: {
                    "p50": round(percentile(v, 50) * 1000, 1),
                    "p95": round(percentile(v, 95) * 1000, 1),
                    "n": len(v),
                }
                for name, v in sorted(self.latency.items())
            },
            "rotation_wait_s": round(self.rotation_wait_s, 3),
            "answers_failed": self.answers_failed,
            "answer_errors": dict(sorted(self.answer_errors.items())),
            "answers_retried": self.answers_retried,
            "answers_cut": self.answers_cut,
            "sandbox_errors": self.sandbox_errors,
            "remote_asked": dict(sorted(self.remote_asked.items())),
            "remote_spend_usd": {k: round(v, 6) for k, v in sorted(self.remote_spend.items())},
            "remote_skipped": dict(sorted(self.remote_skipped.items())),
            "remote_ledger_errors": dict(sorted(self.remote_errors.items())),
            "policy_loss": round(sum(self.policy_losses) / len(self.policy_losses), 6)
            if self.policy_losses
            else None,
        }
        self.__init__()  # type: ignore[misc]
        return out


class Phase3:
    """The loop's side that talks to the lab: tasks, the orchestra, the sandbox, the baselines.
    `endpoints`, `ask` and `run` default to the real clients; tests pass their own."""

    def __init__(
        self,
        rl: Dict[str, Any],
        rank: int = 0,
        world_size: int = 1,
        vocab: int = 256,
        endpoints: Optional[Callable[[], List[Any]]] = None,
        ask: Optional[Callable[..., List[Any]]] = None,
        run: Optional[Callable[[List[Dict[str, Any]]], List[Dict[str, Any]]]] = None,
    ) -> None:
        from ..models.tasks import TASKS, task

        self.rl = rl
        self.rank = rank
        self.world_size = world_size
        self.vocab = vocab
        self.tasks = [task(n) for n in rl["tasks"]] if rl.get("tasks") else list(TASKS)
        self.baselines: Dict[str, float] = {}  # task name -> its moving average reward (group_size 1)
        self.run_baseline = 0.0  # the moving average of every task's rewards: a new task's baseline
        self.unjudged_steps = 0  # steps in a row with nothing judged
        self._unjudged_why: Dict[str, str] = {}  # what went wrong in them: source -> its last error
        self.window = Window()
        self.sample: Optional[Dict[str, Any]] = None  # the last step's sample (pick_sample)
        self._budget_checked: set = set()  # models whose caps and context were checked
        self.remote = RemoteUse()  # the remote tiers' share of the tries, and their spend and budget
        if endpoints is None or ask is None:
            from ..orchestra import client

            endpoints = endpoints or client.load_endpoints
            ask = ask or client.ask_all
        if run is None:
            run = self._sandbox_runner()
        self._endpoints, self._ask, self._run = endpoints, ask, run

    @staticmethod
    def _sandbox_runner() -> Callable[[List[Dict[str, Any]]], List[Dict[str, Any]]]:
        from ..sandbox.client import load_service

        try:
            service = load_service()
        except (OSError, ValueError) as exc:
            raise TrainerError(
                f"phase 3 runs the models' code in the sandbox service, and this host has no address "
                f"for it ({exc}): run `labctl sandbox serve`"
            ) from None
        return service.run

    def prompt_ids(self, task: Any, room: int) -> List[int]:
        """The task's CET prompt (cet_prompt) as token ids (bytes), its last `room` of them (the
        settings make seq_len hold all of it: settings.min_seq_len)."""
        data = cet_prompt(task).encode("utf-8", "replace")
        return [b % self.vocab for b in data[-room:]] if room > 0 else []

    def tasks_for(self, step: int) -> List[Any]:
        n = self.rl["tasks_per_step"]
        first = ((step - 1) * self.world_size + self.rank) * n
        return [self.tasks[(first + j) % len(self.tasks)] for j in range(n)]

    def _warm_set(self) -> List[Any]:
        """The endpoints to ask now; while a rotation lists none, wait (counted as rotation wait)."""
        started = time.monotonic()
        last_error = "no model listed"
        while True:
            try:
                eps = self._endpoints()
                if eps:
                    self.window.rotation_wait_s += time.monotonic() - started
                    return eps
            except (OSError, ValueError) as exc:
                last_error = str(exc)
            if time.monotonic() - started > self.rl["wait_s"]:
                raise TrainerError(
                    f"phase 3: no warm model to ask for {self.rl['wait_s']:g} s ({last_error}): "
                    "is the orchestra running (`labctl orchestra status`)?"
                )
            time.sleep(0.2)

    def rollouts(self, step: int, sample: Callable[[List[int], int], List[int]], room: int) -> List[Rollout]:
        """This step's tries, judged: `sample(prompt_ids, n)` is the CET writing n context ids;
        `group_size` of them per task. Raises TrainerError on the `max_unjudged_steps`-th step in
        a row that judged nothing."""
        rl = self.rl
        rolls = []
        for j, t in enumerate(self.tasks_for(step)):
            p = self.prompt_ids(t, room - rl["context_tokens"])
            for _ in range(rl["group_size"]):
                rolls.append(Rollout(t, p, sample(p, rl["context_tokens"]), j))
        self.window.tries += len(rolls)
        endpoints = self._warm_set()
        self._check_budget(endpoints)

        def ask(i: int) -> List[Any]:
            r = rolls[i]
            # A remote tier's tries are named, not drawn: a resumed step asks it for the same ones.
            these = self.remote.endpoints_for(endpoints, f"{step}:{self.rank}:{i}:{r.task.name}")
            if not these:
                return []
            prompt = ask_prompt(r.task, context_text(r.context_ids))
            answers = self._ask(
                these, prompt, max_tokens=rl["answer_tokens"], temperature=rl["answer_temperature"]
            )
            self.remote.record(these, answers)
            return answers

        with ThreadPoolExecutor(max_workers=min(len(rolls), ASK_WORKERS)) as ex:
            asked = list(ex.map(ask, range(len(rolls))))
        for i, r in enumerate(rolls):  # indices, not zip(strict=): Python 3.8
            r.answers = asked[i]
        used = self.remote.flush()
        self.window.add_remote(used)
        # A tier out of budget is why a try that only it would have answered went unjudged.
        why: Dict[str, str] = {f"remote tier {t}": w for t, w in used["skipped"].items()}
        programs: List[Dict[str, Any]] = []
        owners: List[Rollout] = []
        answered: List[Any] = []  # each program's answer
        failed: List[Tuple[Rollout, Any]] = []
        for r in rolls:
            for a in r.answers:
                if a.retried:
                    self.window.answers_retried += 1
                    self.window.rotation_wait_s += float(getattr(a, "waited_s", 0.0))
                if not a.ok:
                    self.window.answers_failed += 1
                    self.window.answer_errors[a.name] = why[f"answer from {a.name}"] = str(a.error)[:200]
                    failed.append((r, a))
                    continue
                if getattr(a, "finish_reason", None) == "length":
                    self.window.answers_cut += 1  # run all the same: a program may end before the cut
                # The latency is the answering model's own (a retried answer was another's).
                self.window.latency.setdefault(a.answered_by, []).append(a.latency_s)
                prog = r.task.as_program(program_of(a.text or ""))
                prog["timeout"] = rl["timeout_s"]
                programs.append(prog)
                owners.append(r)
                answered.append(a)
        # The same program for the same task runs once: a group's contexts, and models that agree,
        # often bring back the same code, and its tests' outcome is the program's, not the asker's.
        first: Dict[str, int] = {}
        distinct: List[Dict[str, Any]] = []
        which: List[int] = []
        for prog in programs:
            k = first.setdefault(_program_key(prog), len(distinct))
            if k == len(distinct):
                distinct.append(prog)
            which.append(k)
        ran = self._run_sandbox(distinct) if distinct else []
        self.window.programs_run += len(ran)
        for i, k in enumerate(which):
            if k < len(ran):
                owners[i].results.append(ran[k])
        tried = [
            (owners[i], answered[i], programs[i], ran[k] if k < len(ran) else None)
            for i, k in enumerate(which)
        ]
        self.sample = pick_sample(step, self.rank, tried, failed)
        for r in rolls:
            judged = []
            for x in r.results:
                if "error" in x:  # the sandbox could not run it (no image, Docker failing)
                    self.window.sandbox_errors += 1
                    why["sandbox"] = str(x["error"])[:200]
                else:
                    judged.append(x)
            total = sum(x["total"] for x in judged)
            if total:
                r.reward = sum(x["passed"] for x in judged) / total
                self.window.rewards.append(r.reward)
                self.window.tries_judged += 1
            for x in judged:
                for t in x["tests"]:
                    self.window.executions += 1
                    self.window.executions_ok += int(t["exit_code"] == 0 and not t["timed_out"])
        self._advantages(rolls)
        self._count_unjudged(rolls, why)
        return rolls

    def _check_budget(self, endpoints: List[Any]) -> None:
        """Refuse, once per model that joins, a warm model that cannot take phase 3's requests (an
        answer above its engine's cap, a prompt beyond its context): every request to it would be a
        400, and the run would go on judging nothing. The prompt is counted in bytes, an upper bound
        of any tokenizer's count."""
        from ..orchestra.client import check_budget

        # Only what the endpoints file describes (a caller's own stand-ins carry no figures).
        new = [e for e in endpoints if hasattr(e, "engine") and e.name not in self._budget_checked]
        if not new:
            return
        hint = "x" * int(self.rl["context_tokens"])
        longest = max(len(ask_prompt(t, hint).encode("utf-8")) for t in self.tasks)
        problems = check_budget(new, longest, int(self.rl["answer_tokens"]))
        if problems:
            raise TrainerError("phase 3 cannot ask every warm model: " + "; ".join(problems))
        self._budget_checked.update(str(e.name) for e in new)

    def _run_sandbox(self, programs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
        from ..sandbox.client import SandboxError

        tries = self.rl["sandbox_tries"]
        for attempt in range(tries):
            try:
                return self._run(programs)
            except SandboxError as exc:
                self.window.sandbox_errors += 1
                if attempt == tries - 1 or exc.status in (400, 401):
                    raise TrainerError(
                        f"phase 3: the sandbox service failed {attempt + 1} times: {exc}"
                    ) from None
                time.sleep(1.0 * (attempt + 1))
        return []

    def _advantages(self, rolls: List[Rollout]) -> None:
        """reward - baseline for each judged try: its group's mean reward (group_size > 1), or
        its task's moving average, which then moves towards the task's rewards of this step."""
        judged = [r for r in rolls if r.reward is not None]
        if self.rl["group_size"] > 1:
            groups: Dict[int, List[Rollout]] = {}
            for r in judged:
                groups.setdefault(r.group, []).append(r)
            for members in groups.values():
                mean = sum(float(r.reward or 0.0) for r in members) / len(members)
                for r in members:
                    r.baseline = mean
                    r.advantage = float(r.reward or 0.0) - mean
                self.window.baselines.append(mean)
            return
        rewards: Dict[str, List[float]] = {}
        for r in judged:
            reward = float(r.reward or 0.0)
            name = r.task.name
            # A task not judged before is expected to score what tasks have scored so far (0 at
            # the start: nothing is expected yet), so its first try teaches too.
            r.baseline = self.baselines.get(name, self.run_baseline)
            r.advantage = reward - r.baseline
            self.window.baselines.append(r.baseline)
            rewards.setdefault(name, []).append(reward)
        d = self.rl["baseline_decay"]
        for name, rs in rewards.items():
            mean = sum(rs) / len(rs)
            self.baselines[name] = d * self.baselines.get(name, self.run_baseline) + (1 - d) * mean
        if judged:
            mean = sum(float(r.reward or 0.0) for r in judged) / len(judged)
            self.run_baseline = d * self.run_baseline + (1 - d) * mean

    def _count_unjudged(self, rolls: List[Rollout], why: Dict[str, str]) -> None:
        """Count a step that judged nothing; stop the run on the `max_unjudged_steps`-th in a row."""
        if any(r.reward is not None for r in rolls):
            self.unjudged_steps = 0
            self._unjudged_why = {}
        else:
            self.unjudged_steps += 1
            self._unjudged_why.update(why or {"tests": "no program came back with a test result"})
        self.window.unjudged_steps = self.unjudged_steps
        limit = self.rl["max_unjudged_steps"]
        if limit and self.unjudged_steps >= limit:
            seen = "; ".join(f"{k}: {v}" for k, v in sorted(self._unjudged_why.items()))
            raise TrainerError(
                f"phase 3: nothing was judged for {self.unjudged_steps} steps in a row "
                f"(rl.max_unjudged_steps is {limit}), so no reward teaches the CET; last errors: {seen}"
            )


def pick_sample(
    step: int,
    rank: int,
    tried: List[Tuple[Rollout, Any, Dict[str, Any], Optional[Dict[str, Any]]]],
    failed: List[Tuple[Rollout, Any]],
) -> Optional[Dict[str, Any]]:
    """One of the step's tries as a person reads it (samples.jsonl): the model, its program, how
    the sandbox ran it, the first test's output. The try that explains the reward best: the
    judged program that passed least (the first one that passed nothing, when the reward is 0),
    else one the sandbox could not run, else an answer that failed; None when nothing was asked.
    `tried`: (try, answer, program, its result or None) per program, in the order they ran."""
    ran = [(r, a, p, x) for r, a, p, x in tried if x is not None]
    judged = [t for t in ran if "error" not in t[3]]
    pick: Optional[Tuple[Rollout, Any, Dict[str, Any], Dict[str, Any]]] = None
    if judged:
        pick = min(judged, key=lambda t: t[3]["passed"] / t[3]["total"] if t[3].get("total") else 1.0)
    elif ran:
        pick = ran[0]
    if pick is None:
        if not failed:
            return None
        r, a = failed[0]
        return {
            "step": step,
            "rank": rank,
            "task": r.task.name,
            "model": a.answered_by,
            "error": _clip(str(a.error), SAMPLE_OUTPUT_BYTES),
        }
    r, a, prog, result = pick
    source = str(prog.get("source") or "")
    out: Dict[str, Any] = {
        "step": step,
        "rank": rank,
        "task": r.task.name,
        "model": a.answered_by,
        "program": _clip(source, SAMPLE_PROGRAM_BYTES),
        "program_bytes": len(source.encode("utf-8")),
        "cut": getattr(a, "finish_reason", None) == "length",
    }
    if "error" in result:
        out["error"] = _clip(str(result["error"]), SAMPLE_OUTPUT_BYTES)
        return out
    out.update(passed=result.get("passed"), total=result.get("total"), stage=result.get("stage", "run"))
    # A program that did not compile ran no test: the compiler's exit and output say why.
    first = result.get("compile") if result.get("stage") == "compile" else (result.get("tests") or [None])[0]
    if isinstance(first, dict):
        out["exit_code"] = first.get("exit_code")
        out["timed_out"] = bool(first.get("timed_out"))
        out["stdout"] = _clip(str(first.get("stdout") or ""), SAMPLE_OUTPUT_BYTES)
        out["stderr"] = _clip(str(first.get("stderr") or ""), SAMPLE_OUTPUT_BYTES)
    return out


def _clip(text: str, limit: int) -> str:
    """`text` within `limit` bytes of UTF-8, saying how much was left out."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    return data[:limit].decode("utf-8", "ignore") + f"\n[... {len(data) - limit} more bytes]"


def _program_key(program: Dict[str, Any]) -> str:
    import json

    return json.dumps(program, sort_keys=True, default=str)


def sample_context(
    model: Any, prompt_ids: List[int], n: int, temperature: float, generator: Any, device: Any, autocast: Any
) -> List[int]:
    """n token ids the model samples after `prompt_ids` at `temperature` (argmax at 0, which
    phase 3's settings refuse: its policy gradient needs the sampling's probabilities), without grad."""
    import torch

    seq = list(prompt_ids)
    out: List[int] = []
    with torch.no_grad():
        for _ in range(n):
            x = torch.tensor([seq], dtype=torch.long, device=device)
            with autocast():
                logits = model(x)[0, -1].float()
            if temperature <= 0:
                nxt = int(logits.argmax())
            else:
                probs = torch.softmax(logits / temperature, dim=-1).cpu()
                nxt = int(torch.multinomial(probs, 1, generator=generator))
            seq.append(nxt)
            out.append(nxt)
    return out


def rl_batch(rolls: Sequence[Rollout], seq_len: int, device: Any) -> Optional[Tuple[Any, Any, Any]]:
    """(inputs [R, seq_len], targets [R, seq_len], weights [R, seq_len]) of the tries with an
    advantage: each row is the prompt then the context, and the weight at the position that
    predicts each context token is advantage / context length (zero elsewhere). None: no row."""
    import torch

    rows = [r for r in rolls if r.advantage != 0.0 and r.context_ids and r.prompt_ids]
    if not rows:
        return None
    x = torch.zeros((len(rows), seq_len), dtype=torch.long)
    y = torch.zeros((len(rows), seq_len), dtype=torch.long)
    w = torch.zeros((len(rows), seq_len), dtype=torch.float32)
    for i, r in enumerate(rows):
        seq = (r.prompt_ids + r.context_ids)[:seq_len]
        x[i, : len(seq)] = torch.tensor(seq)
        y[i, : len(seq) - 1] = torch.tensor(seq[1:])
        first = len(r.prompt_ids) - 1  # the position whose output is the first context token
        last = min(len(seq) - 1, first + len(r.context_ids))
        w[i, first:last] = r.advantage / len(r.context_ids)
    return x.to(device), y.to(device), w.to(device)


def policy_loss(logits: Any, targets: Any, weights: Any, temperature: float = 1.0) -> Any:
    """REINFORCE's loss: minus the advantage-weighted log-likelihood of the contexts, per row,
    at the `temperature` they were sampled at (softmax(logits / temperature), as sample_context)."""
    import torch

    if temperature <= 0:
        raise ValueError(f"policy_loss needs a temperature above 0, got {temperature}")
    logp = (
        torch.log_softmax(logits.float() / temperature, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    )
    return -(logp * weights).sum() / logits.shape[0]
