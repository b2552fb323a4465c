"""Phase 3's loop: the CET writes a context for a task, every warm model writes a program from
it, the sandbox service runs the programs against the task's tests, and the pass rate is the
reward that teaches the CET (REINFORCE with a moving-average baseline, over the context's
tokens; the language-modelling loss keeps training beside it).

One step: `tasks_per_step` tasks (tasks/, taken in turn; each rank its own); per task the
CET samples `context_tokens` bytes after the task's statement; the warm set (re-read from the
orchestra's endpoints file every step, so it follows a rotation) answers each task's prompt
plus context at once (client.ask_all, which asks another model for a request a rotation cut
off); all the programs go to the sandbox in one batch. A step never fails for a rotation: an
empty warm set is waited for (up to `wait_s`) and the time is counted as the step's rotation
wait; an answer that failed anyway is left out of the reward, not counted as zero.

torch is imported inside the functions that use it (sample_context, rl_batch, policy_loss);
Python 3.8, like the rest of the agent.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from .prompting import ask_prompt, context_text, program_of
from .settings import TrainerError

__all__ = ["Phase3", "Rollout", "context_text", "policy_loss", "program_of", "rl_batch", "sample_context"]


def percentile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q / 100.0 * (len(s) - 1)))] if s else 0.0


class Rollout:
    """One task's try: the prompt and context token ids, the answers, the programs' results."""

    def __init__(self, task: Any, prompt_ids: List[int], context_ids: List[int]) -> None:
        self.task = task
        self.prompt_ids = prompt_ids
        self.context_ids = context_ids
        self.answers: List[Any] = []
        self.results: List[Dict[str, Any]] = []
        self.reward: Optional[float] = None  # None: no answer came back to judge
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
        self.sandbox_errors = 0
        self.policy_losses: List[float] = []

    def flush(self, baseline: Optional[float]) -> Dict[str, Any]:
        out = {
            "reward": round(sum(self.rewards) / len(self.rewards), 4) if self.rewards else None,
            "baseline": None if baseline is None else round(baseline, 4),
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
            "sandbox_errors": self.sandbox_errors,
            "policy_loss": round(sum(self.policy_losses) / len(self.policy_losses), 6)
            if self.policy_losses
            else None,
        }
        self.__init__()  # type: ignore[misc]
        return out


class Phase3:
    """The loop's side that talks to the lab: tasks, the orchestra, the sandbox, the baseline.
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
        from .tasks import TASKS

        self.rl = rl
        self.rank = rank
        self.world_size = world_size
        self.vocab = vocab
        self.tasks = TASKS
        self.baseline: Optional[float] = None
        self.window = Window()
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
        """The task's statement as the CET's token ids (bytes), its last `room` of them."""
        from .tasks import prompt_text

        data = prompt_text(task).encode("utf-8", "replace")
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
        """This step's tries, judged: `sample(prompt_ids, n)` is the CET writing n context ids."""
        rl = self.rl
        rolls = []
        for t in self.tasks_for(step):
            p = self.prompt_ids(t, room - rl["context_tokens"])
            rolls.append(Rollout(t, p, sample(p, rl["context_tokens"])))
        endpoints = self._warm_set()

        def ask(r: Rollout) -> List[Any]:
            prompt = ask_prompt(r.task, context_text(r.context_ids))
            return self._ask(
                endpoints, prompt, max_tokens=rl["answer_tokens"], temperature=rl["answer_temperature"]
            )

        with ThreadPoolExecutor(max_workers=len(rolls)) as ex:
            asked = list(ex.map(ask, rolls))
        for i, r in enumerate(rolls):  # indices, not zip(strict=): Python 3.8
            r.answers = asked[i]
        programs: List[Dict[str, Any]] = []
        owners: List[Rollout] = []
        for r in rolls:
            for a in r.answers:
                if a.retried:
                    self.window.answers_retried += 1
                    self.window.rotation_wait_s += float(getattr(a, "waited_s", 0.0))
                if not a.ok:
                    self.window.answers_failed += 1
                    self.window.answer_errors[a.name] = str(a.error)[:200]
                    continue
                self.window.latency.setdefault(a.name, []).append(a.latency_s)
                prog = r.task.as_program(program_of(a.text or ""))
                prog["timeout"] = rl["timeout_s"]
                programs.append(prog)
                owners.append(r)
        results = self._run_sandbox(programs) if programs else []
        for i, res in enumerate(results):
            owners[i].results.append(res)
        for r in rolls:
            judged = [x for x in r.results if "error" not in x]
            total = sum(x["total"] for x in judged)
            if total:
                r.reward = sum(x["passed"] for x in judged) / total
                self.window.rewards.append(r.reward)
            for x in judged:
                for t in x["tests"]:
                    self.window.executions += 1
                    self.window.executions_ok += int(t["exit_code"] == 0 and not t["timed_out"])
        self._advantages(rolls)
        return rolls

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
        """reward - baseline for each judged try; the baseline then moves towards the rewards."""
        rewards = [r.reward for r in rolls if r.reward is not None]
        if not rewards:
            return
        if self.baseline is None:
            self.baseline = sum(rewards) / len(rewards)  # the first step learns nothing but its level
        for r in rolls:
            if r.reward is not None:
                r.advantage = r.reward - self.baseline
        d = self.rl["baseline_decay"]
        self.baseline = d * self.baseline + (1 - d) * (sum(rewards) / len(rewards))


def sample_context(
    model: Any, prompt_ids: List[int], n: int, temperature: float, generator: Any, device: Any, autocast: Any
) -> List[int]:
    """n token ids the model samples after `prompt_ids` (argmax at temperature 0), without grad."""
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


def policy_loss(logits: Any, targets: Any, weights: Any) -> Any:
    """REINFORCE's loss: minus the advantage-weighted log-likelihood of the contexts, per row."""
    import torch

    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return -(logp * weights).sum() / logits.shape[0]
