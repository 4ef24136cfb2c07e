"""The shipped WikiText-2 copy and tokenizer load offline; the batch order is deterministic."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from agoq_core.train.data import DataError, data_dir, load_corpus, load_tokenizer

_SHA256 = {  # of the files in /work/shared/data/wikitext-2 (pytorch/examples, commit 77f55b9)
    "valid.txt": "f0737ed31fc1329026e95cb8b98e19c2a182c39c240ab909dc31abf2f8af58e8",
    "test.txt": "d790b833ef8cf03a90db7bf1271b7520b83c45ce07ba3c1a9699df81e239eca0",
}


def test_shipped_text_is_the_unmodified_wikitext2_with_attribution():
    d = data_dir()
    for name, digest in _SHA256.items():
        assert hashlib.sha256((d / name).read_bytes()).hexdigest() == digest
    readme = (d.parent / "README.md").read_text()
    for needle in ("Creative Commons Attribution-ShareAlike 3.0", "Merity", "pytorch/examples", "77f55b9"):
        assert needle in readme


def test_tokenizer_loads_offline_and_round_trips(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = load_tokenizer()
    assert tok.get_vocab_size() == 4096
    text = " The European lobster ( Homarus gammarus ) is a species of clawed lobster .\n"
    assert tok.decode(tok.encode(text).ids) == text
    # WikiText's <unk> marker is one special token, not five byte pieces
    assert tok.encode(" <unk> ").ids.count(tok.token_to_id("<unk>")) == 1


def test_committed_tokenizer_is_what_the_build_script_produces():
    import importlib.util

    script = data_dir().parent / "build_tokenizer.py"
    spec = importlib.util.spec_from_file_location("build_tokenizer", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.build() == (data_dir() / "bpe-4096.json").read_text(encoding="utf-8")


def test_corpus_windows_are_consecutive_text():
    c = load_corpus(seq_len=64, eval_tokens=1000)
    tok = load_tokenizer()
    stream = []
    for line in (data_dir() / "valid.txt").read_text(encoding="utf-8").splitlines(keepends=True):
        stream += tok.encode(line).ids
    assert c.train.shape == (len(stream) // 64, 64)
    assert torch.equal(c.train[3], torch.tensor(stream[3 * 64: 4 * 64]))
    assert c.eval.shape == (16, 64)  # ceil(1000 / 64) windows
    assert c.vocab_size == 4096 and int(c.train.max()) < 4096


def test_batch_order_is_deterministic_and_ranks_partition_the_global_batch():
    c = load_corpus(seq_len=64, eval_tokens=64)
    kw = dict(seed=3, micro_batch=2, grad_accum=2)
    one = c.step_batches(5, dp=1, rank=0, **{**kw, "micro_batch": 8, "grad_accum": 1})[0]
    again = c.step_batches(5, dp=1, rank=0, **{**kw, "micro_batch": 8, "grad_accum": 1})[0]
    assert torch.equal(one, again)
    parts = [torch.cat(c.step_batches(5, dp=2, rank=r, **kw)) for r in range(2)]
    # the 8 windows of step 5 are split rank-major: rank 0 gets the first 4, rank 1 the next 4
    assert torch.equal(torch.cat(parts), one)
    other_seed = c.step_batches(5, dp=1, rank=0, seed=4, micro_batch=8, grad_accum=1)[0]
    assert not torch.equal(other_seed, one)
    # an epoch visits every window once
    n = c.train.shape[0]
    seen = torch.cat([c.step_batches(s, seed=0, micro_batch=1, grad_accum=1, dp=1, rank=0)[0] for s in range(n)])
    assert torch.equal(seen.sum(0), c.train.sum(0))


def test_too_much_eval_or_too_long_sequences_fail_clearly():
    with pytest.raises(DataError, match="lower eval_tokens"):
        load_corpus(seq_len=128, eval_tokens=10**8)
    with pytest.raises(DataError, match="longer than the training text"):
        load_corpus(seq_len=10**7, eval_tokens=1)
