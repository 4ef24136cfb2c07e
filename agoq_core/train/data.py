"""The shipped WikiText-2 text and tokenizer, and a deterministic batch order shared by every arm.

Training sequences are consecutive ``seq_len``-token windows of ``valid.txt``; the held-out set is
``eval_tokens`` worth of windows spread evenly over ``test.txt``. Nothing is downloaded: both files and
the tokenizer ship in ``agoq_core/data/`` (see its README for the CC BY-SA 3.0 attribution).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

import torch

from agoq_core.errors import AgoqError

__all__ = ["DataError", "Corpus", "load_corpus", "data_dir", "load_tokenizer", "TOKENIZER_FILE"]

TOKENIZER_FILE = "bpe-4096.json"
_SPLITS = {"train": "valid.txt", "eval": "test.txt"}


class DataError(AgoqError, RuntimeError):
    """The shipped data is missing or too small for the requested run."""


def data_dir() -> Path:
    """Folder of the shipped WikiText-2 copy (inside the installed package)."""
    path = Path(str(resources.files("agoq_core") / "data" / "wikitext-2"))
    if not (path / TOKENIZER_FILE).is_file():
        raise DataError(
            f"the shipped data folder {path} lacks {TOKENIZER_FILE}; the agoq installation is incomplete "
            "(reinstall it; package data agoq_core/data/** must be included)"
        )
    return path


@lru_cache(maxsize=1)
def load_tokenizer():
    """The byte-level BPE tokenizer trained by agoq_core/data/build_tokenizer.py (no hub access)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(data_dir() / TOKENIZER_FILE))


@lru_cache(maxsize=2)
def _token_stream(split: str) -> torch.Tensor:
    path = data_dir() / _SPLITS[split]
    if not path.is_file():
        raise DataError(f"the shipped text {path} is missing; reinstall agoq")
    tok = load_tokenizer()
    # Encode line by line (batched in Rust): one 1 MB string would be a single pre-tokenisation job.
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    ids: list[int] = []
    for enc in tok.encode_batch(lines):
        ids.extend(enc.ids)
    return torch.tensor(ids, dtype=torch.int64)


@dataclass(frozen=True)
class Corpus:
    """Tokenised train windows and held-out eval windows, plus the data order of a run."""

    train: torch.Tensor   # [num_train_windows, seq_len] int64
    eval: torch.Tensor    # [num_eval_windows, seq_len] int64
    vocab_size: int
    train_tokens_total: int
    eval_tokens_total: int

    def step_batches(self, step: int, *, seed: int, micro_batch: int, grad_accum: int, dp: int,
                     rank: int) -> list[torch.Tensor]:
        """The ``grad_accum`` micro-batches (each ``[micro_batch, seq_len]``) that data-parallel rank
        ``rank`` trains on at optimizer step ``step``.

        The global order is a seeded permutation of the windows per epoch; step s takes the next
        ``dp * grad_accum * micro_batch`` windows of it, split rank-major. It depends on (seed, step,
        shapes) only, so every arm and every run with the same settings sees the same data.
        """
        per_step = dp * grad_accum * micro_batch
        n = self.train.shape[0]
        start = step * per_step
        out = []
        idx = torch.empty(per_step, dtype=torch.int64)
        for j in range(per_step):
            epoch, pos = divmod(start + j, n)
            idx[j] = _epoch_permutation(n, seed, epoch)[pos]
        mine = idx.view(dp, grad_accum, micro_batch)[rank]
        for a in range(grad_accum):
            out.append(self.train[mine[a]])
        return out

    def eval_batches(self, micro_batch: int) -> list[torch.Tensor]:
        return list(torch.split(self.eval, micro_batch))


@lru_cache(maxsize=8)
def _epoch_permutation(n: int, seed: int, epoch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=g)


def load_corpus(*, seq_len: int, eval_tokens: int) -> Corpus:
    """Tokenise the shipped splits (cached per process) and cut them into ``seq_len`` windows."""
    train_ids = _token_stream("train")
    eval_ids = _token_stream("eval")
    n_train = train_ids.numel() // seq_len
    n_eval_avail = eval_ids.numel() // seq_len
    if n_train < 1:
        raise DataError(f"seq_len {seq_len} is longer than the training text ({train_ids.numel()} tokens)")
    n_eval = -(-eval_tokens // seq_len)
    if n_eval > n_eval_avail:
        raise DataError(
            f"eval_tokens {eval_tokens} needs {n_eval} windows of {seq_len} tokens but test.txt has "
            f"{n_eval_avail} ({eval_ids.numel()} tokens); lower eval_tokens"
        )
    train = train_ids[: n_train * seq_len].view(n_train, seq_len)
    all_eval = eval_ids[: n_eval_avail * seq_len].view(n_eval_avail, seq_len)
    # Evenly spaced windows: the held-out set covers all of test.txt, not its first article only.
    pick = torch.linspace(0, n_eval_avail - 1, n_eval).round().long()
    return Corpus(
        train=train, eval=all_eval[pick].contiguous(), vocab_size=load_tokenizer().get_vocab_size(),
        train_tokens_total=train_ids.numel(), eval_tokens_total=eval_ids.numel(),
    )
