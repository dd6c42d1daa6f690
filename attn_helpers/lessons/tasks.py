"""Notebooks 01 and 06's toy tasks, seeded: :data:`REVERSAL` (``3 1 4 -> 4 1 3``, 4 to 24 digits)
and :data:`DATES` (``twenty one march nineteen ninety nine -> 1 9 9 9 - 0 3 - 2 1``). Ids 0, 1, 2
are ``<pad>``, ``<s>``, ``</s>``; a :class:`Batch` holds padded tensors.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .._checks import require_positive_int

__all__ = ["PAD", "SOS", "EOS", "Vocab", "Batch", "Task", "REVERSAL", "DATES", "TASKS",
           "get_task", "reversal_pair", "date_pair", "date_to_words", "date_fields",
           "ISO_STEP_FIELDS", "make_batch", "collate", "example", "eval_batches"]

PAD, SOS, EOS = 0, 1, 2


class Vocab:
    """Token strings <-> ids, after the special tokens ``<pad>``, ``<s>``, ``</s>``."""

    def __init__(self, tokens: Sequence[str]):
        self.itos: list[str] = ["<pad>", "<s>", "</s>", *tokens]
        if len(set(self.itos)) != len(self.itos):
            raise ValueError("tokens must be unique and must not repeat the special tokens")
        self.stoi: dict[str, int] = {t: i for i, t in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, tokens: Sequence[str]) -> list[int]:
        """Token strings -> ids; an unknown token raises ``ValueError``."""
        unknown = [t for t in tokens if t not in self.stoi]
        if unknown:
            raise ValueError(f"unknown token(s) {unknown[:5]}; the vocabulary has {self.itos[3:]}")
        return [self.stoi[t] for t in tokens]

    def decode(self, ids) -> list[str]:
        """Ids -> token strings, stopping at the first ``</s>`` and skipping ``<pad>``/``<s>``."""
        ids = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
        ids = ids[:ids.index(EOS)] if EOS in ids else ids
        return [self.itos[i] for i in ids if i not in (PAD, SOS)]


@dataclass
class Batch:
    """``b`` padded pairs: ``src`` ``(b, n_src)``, ``tgt_in`` (``<s>`` + target) and ``tgt_out``
    (target + ``</s>``) ``(b, n_tgt + 1)``, lengths ``(b,)`` without ``</s>``."""

    src: torch.Tensor
    src_lengths: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    tgt_lengths: torch.Tensor

    @property
    def content_mask(self) -> torch.Tensor:
        """``(b, n_tgt + 1)`` bool, True only at real target tokens (``</s>`` excluded)."""
        steps = torch.arange(self.tgt_out.shape[1])
        return steps[None, :] < self.tgt_lengths[:, None]

    def __len__(self) -> int:
        return self.src.shape[0]


DIGITS = [str(d) for d in range(10)]


def reversal_pair(length: int, generator: torch.Generator) -> tuple[list[str], list[str]]:
    """A random digit sequence of ``length`` tokens and its reverse."""
    require_positive_int("length", length)
    digits = torch.randint(0, 10, (length,), generator=generator).tolist()
    source = [str(d) for d in digits]
    return source, source[::-1]


_UNITS = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
          "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
          "eighteen", "nineteen"]
_TENS = {2: "twenty", 3: "thirty", 5: "fifty", 6: "sixty", 7: "seventy", 8: "eighty", 9: "ninety"}
MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december"]
_DAYS_IN_MONTH = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
YEAR_RANGE = (1950, 2029)


def _number_words(n: int) -> list[str]:
    """1..99 without 40s (not needed by the dates task) as words: 21 -> ['twenty', 'one']."""
    if n < 20:
        return [_UNITS[n]]
    tens, unit = divmod(n, 10)
    return [_TENS[tens]] + ([_UNITS[unit]] if unit else [])


def date_to_words(year: int, month: int, day: int) -> list[str]:
    """``(1999, 3, 21) -> ['twenty', 'one', 'march', 'nineteen', 'ninety', 'nine']``, 1950-2029."""
    if not YEAR_RANGE[0] <= year <= YEAR_RANGE[1]:
        raise ValueError(f"year must lie in {YEAR_RANGE[0]}..{YEAR_RANGE[1]}, got {year}")
    if not 1 <= month <= 12 or not 1 <= day <= _DAYS_IN_MONTH[month - 1]:
        raise ValueError(f"no such date: year {year}, month {month}, day {day}")
    if year < 2000:
        year_words = ["nineteen", *_number_words(year - 1900)]
    else:
        year_words = ["two", "thousand", *(_number_words(year - 2000) if year > 2000 else [])]
    return [*_number_words(day), MONTHS[month - 1], *year_words]


# For each of the 10 output steps of an ISO date, the field of the input it copies ("-": none).
ISO_STEP_FIELDS = ("year", "year", "year", "year", "-", "month", "month", "-", "day", "day")


def date_fields(words: Sequence[str]) -> list[str]:
    """The field of each word of a date in words: ``['day', 'day', 'month', 'year', ...]``."""
    months = [i for i, w in enumerate(words) if w in MONTHS]
    if len(months) != 1:
        raise ValueError(f"words must hold exactly one month name, got {list(words)}")
    m = months[0]
    return ["day"] * m + ["month"] + ["year"] * (len(words) - m - 1)


def date_pair(generator: torch.Generator) -> tuple[list[str], list[str]]:
    """A random date in words and its ISO form as characters (``1 9 9 9 - 0 3 - 2 1``)."""
    year = YEAR_RANGE[0] + int(torch.randint(0, YEAR_RANGE[1] - YEAR_RANGE[0] + 1, (1,),
                                             generator=generator))
    month = 1 + int(torch.randint(0, 12, (1,), generator=generator))
    day = 1 + int(torch.randint(0, _DAYS_IN_MONTH[month - 1], (1,), generator=generator))
    return date_to_words(year, month, day), list(f"{year:04d}-{month:02d}-{day:02d}")


@dataclass(frozen=True)
class Task:
    """Vocabularies and a sampler; ``lengths`` is the source length range, or ``None`` (dates)."""

    name: str
    src_vocab: Vocab
    tgt_vocab: Vocab
    sampler: Callable[..., tuple[list[str], list[str]]]
    lengths: tuple[int, int] | None = None

    def sample(self, generator: torch.Generator, length: int | None = None):
        """One ``(source tokens, target tokens)`` pair; ``length`` only for tasks with lengths."""
        if self.lengths is None:
            if length is not None:
                raise ValueError(f"task {self.name!r} draws its own lengths; got length={length}")
            return self.sampler(generator)
        if length is None:
            low, high = self.lengths
            length = low + int(torch.randint(0, high - low + 1, (1,), generator=generator))
        return self.sampler(length, generator)


_DATE_WORDS = sorted({w for w in [*_UNITS[1:], *_TENS.values(), *MONTHS, "thousand"]})
REVERSAL = Task("reversal", Vocab(DIGITS), Vocab(DIGITS), reversal_pair, lengths=(4, 24))
DATES = Task("dates", Vocab(_DATE_WORDS), Vocab([*DIGITS, "-"]), date_pair)
TASKS = {task.name: task for task in (REVERSAL, DATES)}


def get_task(task: str | Task) -> Task:
    """A :class:`Task` from its name (``"reversal"`` or ``"dates"``), or the task itself."""
    if isinstance(task, Task):
        return task
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {sorted(TASKS)}")
    return TASKS[task]


def collate(task: str | Task, pairs: Sequence[tuple[Sequence[str], Sequence[str]]]) -> Batch:
    """Pad a list of ``(source tokens, target tokens)`` pairs into a :class:`Batch`."""
    task = get_task(task)
    if not pairs:
        raise ValueError("pairs must hold at least one (source, target) pair")
    src = [task.src_vocab.encode(s) for s, _ in pairs]
    tgt = [task.tgt_vocab.encode(t) for _, t in pairs]
    if any(len(s) == 0 for s in src):
        raise ValueError("every source must hold at least one token")
    b, n_src, n_tgt = len(pairs), max(map(len, src)), max(map(len, tgt))
    batch = Batch(torch.full((b, n_src), PAD), torch.tensor([len(s) for s in src]),
                  torch.full((b, n_tgt + 1), PAD), torch.full((b, n_tgt + 1), PAD),
                  torch.tensor([len(t) for t in tgt]))
    for i, (s, t) in enumerate(zip(src, tgt, strict=True)):
        batch.src[i, :len(s)] = torch.tensor(s)
        batch.tgt_in[i, :len(t) + 1] = torch.tensor([SOS, *t])
        batch.tgt_out[i, :len(t) + 1] = torch.tensor([*t, EOS])
    return batch


def make_batch(
    task: str | Task, batch_size: int, generator: torch.Generator, length: int | None = None
) -> Batch:
    """``batch_size`` random pairs drawn from ``generator``, all of ``length`` source tokens if given."""
    task = get_task(task)
    require_positive_int("batch_size", batch_size)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return collate(task, [task.sample(generator, length) for _ in range(batch_size)])


def example(task: str | Task, index: int, length: int | None = None):
    """``(source, target)`` tokens of example ``index``: the same pair on every machine."""
    task = get_task(task)
    require_positive_int("index", index, allow_zero=True)
    if length is not None:
        require_positive_int("length", length)
    digest = hashlib.sha256(repr((task.name, index, length)).encode()).digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest[:6], "little"))
    return task.sample(generator, length)


def eval_batches(task: str | Task, per_length: int = 200, *, seed: int = 1234) -> dict:
    """A fixed test set, seeded apart from training: ``{length: Batch}`` for every length of the
    task's range, or ``{None: Batch}`` (dates)."""
    task = get_task(task)
    require_positive_int("per_length", per_length)
    generator = torch.Generator().manual_seed(seed)
    if task.lengths is None:
        return {None: make_batch(task, per_length, generator)}
    low, high = task.lengths
    return {n: make_batch(task, per_length, generator, n) for n in range(low, high + 1)}

