"""The library works with its core dependencies alone (torch, pluggy, numpy); ``agoq train`` (the app)
checks its extras before any work and names the install command.

The extras are made missing in a fresh interpreter: the path finder is replaced by one that does not
see them, so imports fail and ``importlib.util.find_spec`` returns None, as for an uninstalled package.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from agoq_core.cli.main import main
from agoq_core.train import MissingExtraError, TrainConfig
from agoq_core.train import extras as extras_mod

EXTRAS = ("transformers", "tokenizers", "matplotlib", "tqdm", "bitsandbytes", "peft", "accelerate", "torchao",
          "torchtitan", "yaml", "hypothesis", "safetensors", "huggingface_hub")

_BLOCK = f"""
import importlib.machinery, sys
class _Hiding(importlib.machinery.PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in {EXTRAS!r}:
            return None
        return super().find_spec(name, path, target)
sys.meta_path[:] = [_Hiding if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
"""


def _run(body: str) -> subprocess.CompletedProcess:
    code = _BLOCK + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


def test_library_imports_and_works_without_the_extras():
    out = _run("""
        import importlib, pkgutil
        import torch
        import agoq_core
        for m in pkgutil.walk_packages(agoq_core.__path__, "agoq_core."):   # every module imports
            importlib.import_module(m.name)
        bad = sorted({m.split(".")[0] for m in sys.modules} & set({extras}))
        assert not bad, bad
        # codecs
        x = torch.randn(3, 300)
        q = agoq_core.quantize(x, "int4")
        assert agoq_core.dequantize(q).shape == x.shape
        # LAAQ on one's own model code
        from agoq_core import laaq
        lin = torch.nn.Linear(64, 32)
        laaq.convert_linear(lin)
        lin(torch.randn(4, 64, requires_grad=True)).sum().backward()
        assert lin.weight.grad is not None
        # the planner's schedule walk
        from agoq_core.planner import PipelineSpec, inflight
        prof = inflight(PipelineSpec(schedule="interleaved-1f1b", stages=4, microbatches=8))
        assert [max(sum(s) for s in r.states) for r in prof.ranks] == [11, 9, 7, 5]
        # the model registry, without transformers
        from agoq_core.models import get_model_shape, ModelShapeError
        assert get_model_shape("llama-1b").vocab == 128256
        try:
            get_model_shape("tiny").to_hf_config()
        except ModelShapeError as exc:
            assert "pip install" in str(exc)
        else:
            raise AssertionError("to_hf_config without transformers must say how to install it")
        print("ok")
    """.replace("{extras}", repr(EXTRAS)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("ok")


def test_agoq_train_names_the_missing_extras_before_any_work(tmp_path):
    out = _run(f"""
        from agoq_core.cli.main import main
        rc = main(["train", "--steps", "1", "--out-dir", {str(tmp_path)!r}])
        print("rc", rc)
    """)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rc 2" in out.stdout
    err = out.stderr
    assert "agoq train: error: agoq train needs packages that are not installed" in err
    for m in ("transformers", "tokenizers", "matplotlib", "tqdm"):
        assert m in err
    assert "pip install 'agoq[train]'" in err
    assert not any(tmp_path.iterdir())  # nothing started: no run folder


def test_only_what_the_run_uses_is_required(monkeypatch):
    # simulate a missing matplotlib in this process: find_spec says "not installed"
    real = extras_mod.importlib.util.find_spec
    monkeypatch.setattr(extras_mod.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("matplotlib", "bitsandbytes") else real(name, *a))
    assert extras_mod.missing_extras(TrainConfig(plot=False)) == []
    assert [m for m, _ in extras_mod.missing_extras(TrainConfig())] == ["matplotlib"]
    assert [m for m, _ in extras_mod.missing_extras(TrainConfig(plot=False, agoq_optimizer="adamw8bit"))] == \
        ["bitsandbytes"]
    with pytest.raises(MissingExtraError, match=r"matplotlib \(for curves.png \(or pass --no-plot\)\)"):
        extras_mod.check_extras(TrainConfig())


def test_missing_matplotlib_fails_at_start_not_after_training(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError; find_spec -> error
    rc = main(["train", "--steps", "1", "--no-progress", "--out-dir", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "matplotlib (for curves.png (or pass --no-plot))" in err and "pip install 'agoq[train]'" in err
    assert not any(tmp_path.iterdir())
