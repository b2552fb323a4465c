"""The reference trainer's data: a synthetic byte-level corpus, generated, never downloaded.

The text is an order-2 Markov chain over the printable ASCII bytes (or all ids of a vocab
smaller than 127) with sparse transitions: after symbol `b` only 8 successors (fixed per `b`)
can follow, and how likely each one is depends on the symbol before `b`. A model first learns
which bytes occur at all (ln 256 -> ln 95 in a few steps), then which follow which (towards
ln 8) and then the order-2 skew below that (about 1.7 nats), so a falling loss means the model,
optimizer and data path work.

Batches are a pure function of (seed, step, sample index): sample `i` of step `s` is a window
of the corpus at an offset hashed from (seed, s, i). A process's micro-batch is a slice of the
step's global sample range, so a resumed run sees exactly the data it would have seen, and
the same step splits the same samples whatever the world size, micro-batch size and
accumulation (halving the micro-batch and doubling accumulation changes no sample).

torch is imported inside functions: the agent package must import on a host without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Tuple

if TYPE_CHECKING:
    import torch

# Byte-level like text: the printable ASCII bytes, as a text corpus uses under 100 of 256 byte
# values. The model learns within a few steps which ids never occur, then the transitions.
PRINTABLE = (32, 127)
FANOUT = 8  # successors per symbol: the order-1 structure the model learns first
CORPUS_TOKENS = 1 << 20  # the text that windows are cut from (8 MiB as int64)
# Slot probabilities for the 8 successors; the order-2 context permutes them.
_SKEW = (0.40, 0.22, 0.13, 0.09, 0.06, 0.05, 0.03, 0.02)
_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a cheap, well-spread 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def sample_hash(seed: int, step: int, index: int) -> int:
    """The 64-bit hash that places sample `index` of `step`: the batch's only source of randomness."""
    return _mix(_mix(_mix(seed & _MASK) ^ (step & _MASK)) ^ (index & _MASK))


def sample_range(micro_step: int, rank: int, batch_size: int, accumulation_steps: int) -> Tuple[int, int]:
    """[start, stop) of a process's micro-batch within its step's global sample indices.

    Rank-major then micro-step: rank r owns samples [r*b*a, (r+1)*b*a), so (b, a) and (2b, a/2)
    and one rank of 2b against two of b all cover the same samples in each step.
    """
    start = (rank * accumulation_steps + micro_step) * batch_size
    return start, start + batch_size


class Corpus:
    """The token stream for (seed, vocab, seq_len), and the batches cut from it."""

    def __init__(self, seed: int, vocab: int, seq_len: int) -> None:
        import torch

        if vocab < 2:
            raise ValueError(f"corpus: vocab must be at least 2, got {vocab}")
        if seq_len < 1:
            raise ValueError(f"corpus: seq_len must be positive, got {seq_len}")
        self.seed = seed
        self.vocab = vocab
        self.seq_len = seq_len
        # ids the text uses: printable ASCII when the vocab holds it, else all of a small vocab
        low, high = PRINTABLE if vocab >= PRINTABLE[1] else (0, vocab)
        self.alphabet = high - low
        # Chains long enough that every window fits in one, so no window spans two chains.
        length = 1024
        while length < 4 * (seq_len + 1):
            length *= 2
        self.chain_len = length
        self.chains = max(1, CORPUS_TOKENS // length)
        self.positions = length - (seq_len + 1) + 1
        self.tokens = generate(seed, self.alphabet, self.chains, length).reshape(-1).add_(low)
        self._window = torch.arange(seq_len + 1, dtype=torch.int64)
        self.device = self.tokens.device

    def to(self, device: Any) -> "Corpus":
        """Keep the stream on `device`: a batch is then one small copy of offsets, then a gather there."""
        self.tokens = self.tokens.to(device)
        self._window = self._window.to(device)
        self.device = self.tokens.device
        return self

    def offsets(self, step: int, start: int, stop: int) -> List[int]:
        """Where in the stream samples [start, stop) of `step` begin."""
        out = []
        for i in range(start, stop):
            h = sample_hash(self.seed, step, i)
            chain = h % self.chains
            pos = (h >> 32) % self.positions
            out.append(chain * self.chain_len + pos)
        return out

    def samples(self, step: int, start: int, stop: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of samples [start, stop) of `step`, each [stop - start, seq_len] int64."""
        import torch

        base = torch.tensor(self.offsets(step, start, stop), dtype=torch.int64)
        if self.device.type != "cpu":
            base = base.to(self.device, non_blocking=True)
        windows = self.tokens[base[:, None] + self._window]
        return windows[:, :-1], windows[:, 1:]

    def batch(
        self,
        step: int,
        micro_step: int,
        rank: int,
        world_size: int,
        batch_size: int,
        accumulation_steps: int,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch that process `rank` of `world_size` trains on at (step, micro_step)."""
        if not 0 <= rank < world_size:
            raise ValueError(f"corpus: rank {rank} outside world size {world_size}")
        if not 0 <= micro_step < accumulation_steps:
            raise ValueError(
                f"corpus: micro_step {micro_step} outside {accumulation_steps} accumulation steps"
            )
        start, stop = sample_range(micro_step, rank, batch_size, accumulation_steps)
        return self.samples(step, start, stop)


def generate(seed: int, alphabet: int, chains: int, length: int) -> Any:
    """`chains` independent runs of the Markov chain, [chains, length] int64, from `seed` alone.

    Vectorised across chains (one step of every chain per tensor op), so a million tokens take
    tens of milliseconds rather than the seconds a Python loop would.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    fanout = min(FANOUT, alphabet)
    # successors[b]: the symbols that may follow b (distinct, fixed per b).
    successors = torch.argsort(torch.rand(alphabet, alphabet, generator=gen), dim=1)[:, :fanout]
    skew = torch.tensor(_SKEW[:fanout], dtype=torch.float64)
    # The symbol before b permutes the slot probabilities: the order-2 part.
    perms = torch.argsort(torch.rand(alphabet, fanout, generator=gen), dim=1)
    cum = torch.cumsum(skew[perms] / skew.sum(), dim=1)
    cum[:, -1] = 1.0 + 1e-9  # rounding must never push a draw past the last slot
    out = torch.empty(chains, length, dtype=torch.int64)
    prev = torch.randint(0, alphabet, (chains,), generator=gen)
    cur = torch.randint(0, alphabet, (chains,), generator=gen)
    out[:, 0] = cur
    draws = torch.rand(length, chains, 1, generator=gen, dtype=torch.float64)
    for t in range(1, length):
        slot = (draws[t] >= cum[prev]).sum(dim=1).clamp_(max=fanout - 1)
        nxt = successors[cur, slot]
        out[:, t] = nxt
        prev, cur = cur, nxt
    return out
