"""A tiny coder model labctl trains itself, so phase 3's reward can be above zero without a download.

    python -m labctl.agent.modelload.codergen --out DIR [--seed 0] [--tasks 8] [--held-out 4]
        [--hint-matters] [--seconds S] [--steps N] [--threads 1] [--hidden 128] [--layers 2]

It is hfgen's model (a Llama with the byte-level BPE trained on the phase-3 tasks), trained on
the CPU to answer phase 3's exact prompt, `prompting.ask_prompt(task, hint)`, with the task's
reference solution and the end-of-sequence token: a warm model phase 3 asks then writes
programs that pass, and the reward moves.

- The trained tasks are the first `tasks` tasks of TASKS whose solution fits phase 3's answer
  budget (`answer_tokens`): phase 3 asks the tasks in that order, so a short run meets them
  first. The next `held_out` such tasks are kept apart, to show what it has not learned.
- The hint is random text as phase 3 shows the CET's context: printable, or mostly '?' (bytes
  an untrained CET writes). By default the model writes the solution whatever the hint. With
  `hint_matters` it writes the solution only when the hint holds the task's tag
  (`prompting.task_tag`, one letter) and `pass` otherwise (no test passes), so a CET that
  learns to put the tag in its context is rewarded; half the examples hold the tag.
- The loss is on the answer's tokens only, plus the deciding token's again (the first where
  the solution and the wrong program differ); AdamW with a short warm-up, then a cosine decay
  over `steps` (or over `seconds` of wall time when given). Training ends early once the model has fit: the last
  `fit_rows` examples, each with a fresh hint, predicted exactly at every answer token
  (teacher-forced argmax: the greedy answer), and the loss below `fit_loss` (a margin for
  phase 3's sampling temperature).

Measured on one thread of a Xeon: 8 tasks fit in about 150 steps (10 s); with `hint_matters`
600 steps (65 s) leave one fresh hint in about 150 answered wrongly. A larger model (`hidden`,
`layers`: 256 and 4 make 4.4M parameters) learns no faster per example and costs five times
more per step.

The same seed and threads write the same bytes, unless `seconds` is given (then the number of
steps depends on the machine). DIR is hfgen's folder plus `labctl_coder.json`: the trained and
held-out task names with their tags, the seed, the steps, the final loss and `hint_matters`.
torch, transformers and tokenizers are imported inside the functions.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import hfgen
from .formats import CODER_RECORD as RECORD

# What the model writes with hint_matters when the hint lacks the tag: it prints nothing, so it
# passes no test (every expected output is a line at least).
WRONG_PROGRAM = "pass\n"
# What phase 3 lets a warm model write by default (rl.answer_tokens): a longer solution would be
# cut off there whatever the model learned.
ANSWER_TOKENS = 64
# Measured with 8 tasks on one thread: they fit in about 150 steps; with hint_matters 100 exact
# rows in a row came while one fresh hint in thirty still failed, and 400 do not come in 600
# steps, by when one in a hundred and fifty fails.
STEPS = 300
FIT_ROWS = 100
HINT_STEPS = 600
HINT_FIT_ROWS = 400
PRINTABLE = "".join(chr(i) for i in range(32, 127))  # what prompting.context_text lets through


def pick_tasks(
    tok: Any, tasks: int, held_out: int, answer_tokens: int, names: Optional[Sequence[str]] = None
) -> Tuple[List[Any], List[Any]]:
    """(trained, held out): see the module's docstring; `names` picks the trained tasks instead."""
    from ..models.tasks import TASKS, task

    fits = [t for t in TASKS if len(tok.encode(t.solution).ids) <= answer_tokens]
    if names:
        trained = [task(n) for n in names]
    else:
        if tasks < 1 or tasks > len(fits):
            raise ValueError(f"tasks must be 1 to {len(fits)} (the tasks whose solution fits), got {tasks}")
        trained = fits[:tasks]
    rest = [t for t in fits if t not in trained]
    if held_out < 0 or held_out > len(rest):
        raise ValueError(f"held_out must be 0 to {len(rest)}, got {held_out}")
    return trained, rest[:held_out]


def random_hint(
    rng: random.Random, n: int, tag: Optional[str] = None, with_tag: bool = False, decoy: Optional[str] = None
) -> str:
    """n characters as phase 3 shows the CET's context (prompting.context_text): half the time
    bytes of any value, mostly '?' there, as an untrained CET writes; else printable ones. With
    `tag`: holding it at a random place, or never holding it; `decoy`: another letter put in."""
    from ..models.prompting import context_text

    if rng.random() < 0.5:
        chars = list(context_text([rng.randrange(256) for _ in range(n)]))
    else:
        chars = [rng.choice(PRINTABLE) for _ in range(n)]
    if tag is not None:
        for i, c in enumerate(chars):
            while c == tag:
                c = rng.choice(PRINTABLE)
            chars[i] = c
    if n and decoy is not None and decoy != tag:
        chars[rng.randrange(n)] = decoy
    if n and tag is not None and with_tag:
        chars[rng.randrange(n)] = tag
    return "".join(chars)


Row = Tuple[List[int], List[int], int]  # prompt ids, answer ids, the answer token that decides


class Examples:
    """Training rows with a fresh random hint each time."""

    def __init__(self, tok: Any, tasks: List[Any], hint_matters: bool, hint_len: int, eos: int) -> None:
        from ..models.prompting import ask_prompt, task_tag

        self.tok, self.tasks, self.hint_matters, self.hint_len = tok, tasks, hint_matters, hint_len
        self.ask_prompt, self.task_tag = ask_prompt, task_tag
        self.solutions = [[*tok.encode(t.solution).ids, eos] for t in tasks]
        self.wrong = [*tok.encode(WRONG_PROGRAM).ids, eos]
        # With hint_matters the choice between the two programs is made at their first differing
        # token, not always the first: a solution may begin as the wrong program does.
        self.decides = [_common(s, self.wrong) if hint_matters else 0 for s in self.solutions]

    def hint_length(self, rng: random.Random) -> int:
        # Around the CET's default length, so a CET with a longer or shorter context still works.
        return rng.randint(max(1, self.hint_len // 2), max(1, self.hint_len * 2))

    def batch(self, rng: random.Random) -> List[Row]:
        rows = []
        tags = [self.task_tag(t) for t in self.tasks]
        for i, t in enumerate(self.tasks):
            if not self.hint_matters:
                hint = random_hint(rng, self.hint_length(rng))
                rows.append((self.tok.encode(self.ask_prompt(t, hint)).ids, self.solutions[i], 0))
                continue
            # Each task with and without its tag in every batch: balanced, so neither answer wins
            # by frequency. Half the hints without it hold another task's tag: the tag must be
            # this task's, not any tag.
            others = [g for g in tags if g != tags[i]]
            decoy = rng.choice(others) if others and rng.random() < 0.5 else None
            for with_tag in (True, False):
                hint = random_hint(rng, self.hint_length(rng), tags[i], with_tag, None if with_tag else decoy)
                prompt = self.tok.encode(self.ask_prompt(t, hint)).ids
                rows.append((prompt, self.solutions[i] if with_tag else self.wrong, self.decides[i]))
        return rows

    def longest(self) -> int:
        """The most tokens a row can have: the prompt's, the longest hint's (a token is a byte at
        least), the answer's."""
        most = 0
        for i, t in enumerate(self.tasks):
            prompt = len(self.tok.encode(self.ask_prompt(t, "")).ids) + 2 * self.hint_len
            most = max(most, prompt + max(len(self.solutions[i]), len(self.wrong)))
        return most


def _common(a: List[int], b: List[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def tensors(rows: List[Row], pad: int) -> Tuple[Any, Any, Any, Any]:
    """(input ids, attention mask, labels, decides), right-padded; labels -100 except on the
    answers; decides: each row's position of the answer token that decides."""
    import torch

    width = max(len(p) + len(a) for p, a, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (p, a, _) in enumerate(rows):
        seq = p + a
        ids[i, : len(seq)] = torch.tensor(seq)
        mask[i, : len(seq)] = 1
        labels[i, len(p) : len(seq)] = torch.tensor(a)
    return ids, mask, labels, torch.tensor([len(p) + d for p, _, d in rows])


def spell_embeddings(model: Any, tok: Any) -> None:
    """Start each multi-byte token's embedding near the sum of its bytes' embeddings, so whether a
    token holds a letter can be read off it from the start: with hint_matters the tag hides in
    whatever token the hint's BPE merges it into, most of them too rare to learn one by one."""
    import torch

    emb = model.get_input_embeddings().weight
    vocab = tok.get_vocab()
    with torch.no_grad():
        base = emb.detach().clone()
        for text, i in vocab.items():
            parts = [vocab[c] for c in text if c in vocab]
            if len(parts) > 1:
                emb[i] = (base[i] + base[parts].sum(0)) / math.sqrt(1 + len(parts))


def lr_at(progress: float, lr: float, warmup: float = 0.05, floor: float = 0.1) -> float:
    """A short linear warm-up, then a cosine from lr down to floor * lr at progress 1."""
    if progress < warmup:
        return lr * (progress + 1e-3) / warmup
    p = min(1.0, (progress - warmup) / (1.0 - warmup))
    return lr * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * p)))


def make_coder_model(
    out: str,
    seed: int = 0,
    tasks: int = 8,
    held_out: int = 4,
    hint_matters: bool = False,
    seconds: Optional[float] = None,
    steps: Optional[int] = None,
    threads: int = 1,
    names: Optional[Sequence[str]] = None,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    vocab: int = 1024,
    lr: float = 1e-3,
    hint_len: int = 16,
    answer_tokens: int = ANSWER_TOKENS,
    fit_rows: Optional[int] = None,
    fit_loss: float = 0.01,
    decision_weight: float = 1.0,
    spell: bool = True,
) -> Dict[str, Any]:
    """Train the coder model and write it to `out` (replaced whole); its record as a dict.
    `steps`: the most steps, over which the LR decays; `fit_rows`: how many examples in a row
    must come out exact to end early (defaults: STEPS and FIT_ROWS, or HINT_ ones)."""
    import torch

    if steps is None:
        steps = HINT_STEPS if hint_matters else STEPS
    if fit_rows is None:
        fit_rows = HINT_FIT_ROWS if hint_matters else FIT_ROWS
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    if seconds is not None and not seconds > 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    started = time.monotonic()
    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        # Sized after its rows: prompt, hint and answer must fit the context the server allows.
        tok = hfgen.make_tokenizer(vocab)
        trained, held = pick_tasks(tok, tasks, held_out, answer_tokens, names)
        eos = hfgen.SPECIALS.index("<|im_end|>")
        examples = Examples(tok, trained, hint_matters, hint_len, eos)
        context = max(512, -(-examples.longest() // 64) * 64)
        model, fast = hfgen.new_model(seed, "llama", vocab, hidden, layers, heads, kv_heads, context, tok=tok)
        if spell:
            spell_embeddings(model, tok)
        info = _train(model, examples, seed, seconds, steps, lr, fit_rows, fit_loss, decision_weight)
    finally:
        torch.set_num_threads(old_threads)
    from ..models.prompting import task_tag

    record = dict(
        info,
        seed=seed,
        hint_matters=hint_matters,
        wrong_program=WRONG_PROGRAM if hint_matters else None,
        hint_len=hint_len,
        trained=[t.name for t in trained],
        held_out=[t.name for t in held],
        tags={t.name: task_tag(t) for t in trained + held},
        threads=threads,
        params=sum(p.numel() for p in model.parameters()),
        context=context,
    )
    hfgen.save_model(out, model, fast, extra={RECORD: record})
    return dict(
        record,
        path=out,
        arch="llama",
        vocab=model.config.vocab_size,
        seconds=round(time.monotonic() - started, 3),
    )


def _train(
    model: Any,
    examples: Examples,
    seed: int,
    seconds: Optional[float],
    steps: int,
    lr: float,
    fit_rows: int,
    fit_loss: float,
    decision_weight: float,
) -> Dict[str, Any]:
    import torch

    pad = model.config.pad_token_id
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    model.train()
    start, cpu_start = time.monotonic(), time.process_time()
    step, loss_v, fit_run, fit_at = 0, float("nan"), 0, None
    while True:
        elapsed = time.monotonic() - start
        progress = elapsed / seconds if seconds is not None else step / steps
        if progress >= 1.0:
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(progress, lr)
        ids, mask, labels, decides = tensors(examples.batch(rng), pad)
        # logits at position i predict the token at i + 1: the teacher-forced greedy answer.
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        want = labels[:, 1:]
        ce = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), want.reshape(-1), ignore_index=-100, reduction="none"
        ).view(want.shape)
        token_loss = ce.sum() / (want != -100).sum()
        # One token picks the program (with hint_matters: the solution or the wrong one);
        # averaged with the others it would weigh one token in twenty.
        decision = ce[torch.arange(len(decides)), decides - 1].mean()
        loss = token_loss + decision_weight * decision
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        loss_v = float(token_loss.detach())
        with torch.no_grad():
            exact = bool(((logits.argmax(-1) == want) | (want == -100)).all())
        fit_run = fit_run + len(decides) if exact and loss_v < fit_loss else 0
        if fit_run >= fit_rows:
            fit_at = step
            break
    model.eval()
    return {
        "steps": step,
        "fit_step": fit_at,
        "final_loss": round(loss_v, 6),
        "train_seconds": round(time.monotonic() - start, 3),
        # CPU time tells the work apart from a busy machine's waiting (one thread: the same thing).
        "train_cpu_seconds": round(time.process_time() - cpu_start, 3),
    }


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m labctl.agent.modelload.codergen", description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tasks", type=int, default=8, help="how many tasks to train (the first that fit)")
    parser.add_argument("--held-out", type=int, default=4, help="how many other tasks to keep apart")
    parser.add_argument(
        "--hint-matters", action="store_true", help="the solution only when the hint holds the tag"
    )
    parser.add_argument("--seconds", type=float, default=None, help="train for this long (not reproducible)")
    parser.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"the most steps; the LR decays over them (default {STEPS}, {HINT_STEPS} with --hint-matters)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    a = parser.parse_args(argv)
    try:
        info = make_coder_model(
            a.out,
            seed=a.seed,
            tasks=a.tasks,
            held_out=a.held_out,
            hint_matters=a.hint_matters,
            seconds=a.seconds,
            steps=a.steps,
            threads=a.threads,
            hidden=a.hidden,
            layers=a.layers,
        )
    except (ImportError, ValueError, OSError) as exc:
        sys.stderr.write(f"codergen: {exc}\n")
        return 1
    sys.stdout.write(json.dumps(info) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
