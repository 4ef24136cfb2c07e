"""LAAQ through every available backend gives the reference backend's gradients bit for bit.

The codecs are bit-exact by contract (docs/formats.md), so the whole LAAQ step must be too, including
chunked codec calls and the token-chunked SwiGLU backward (slices of a QuantizedTensor). In CI the
cuda plugin runs here through the Triton interpreter (TRITON_INTERPRET=1); elsewhere it is skipped.
"""
from __future__ import annotations

import pytest
import torch

from agoq_core.backend import list_backends
from agoq_core.laaq import LAAQConfig, apply, functions, storage
from tests.laaq.conftest import batch, grads, tiny_model

OTHERS = [r["name"] for r in list_backends()["backends"] if r["name"] != "reference" and r["available"]]


@pytest.mark.skipif(not OTHERS, reason="no backend other than reference is available here")
@pytest.mark.parametrize("backend", OTHERS or ["none"])
def test_laaq_is_bit_identical_across_backends(backend, monkeypatch):
    monkeypatch.setattr(functions, "BACKWARD_CHUNK_ELEMS", 176 * 8)  # chunked SwiGLU backward
    monkeypatch.setattr(storage, "_CHUNK", 1024)                      # chunked codec calls
    model = tiny_model("llama", dtype=torch.bfloat16, hidden=64, intermediate=176)
    ids = batch(b=1, s=32)
    out = {}
    for be in ("reference", backend):
        rep = apply(model, LAAQConfig(backend=be, norm_input="int5", attn_out_input="native"))
        out[be] = grads(model, ids)
        rep.undo()
    assert torch.equal(out["reference"][0], out[backend][0])
    g0, g1 = out["reference"][1], out[backend][1]
    assert [n for n in g0 if not torch.equal(g0[n], g1[n])] == []
