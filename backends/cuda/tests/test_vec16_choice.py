"""The 16-lane tile chosen per (op, format): AGOQ_CUDA_VEC16 / CudaGeometry(vec16=...) rules, the defaults
table, and the rule they fall back to; either tile gives the same bits."""
from __future__ import annotations

import pytest
import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format
from agoq_cuda import launch as cl
from agoq_cuda.launch import MAXNREG, CudaGeometry, fused_maxnreg, parse_maxnreg, parse_vec16
from agoq_triton_kernels.launch import Launcher
from cuda_inputs import assert_bits_equal


def test_parse():
    assert parse_vec16(None) == {("*", "*"): None}
    assert parse_vec16("0") == {("*", "*"): False}
    assert parse_vec16(" ON ") == {("*", "*"): True}
    assert parse_vec16("dequantize=0, dequantize:int5=1,*:nf4=auto") == {
        ("dequantize", "*"): False, ("dequantize", "int5"): True, ("*", "nf4"): None}
    for bad in ("dequantise=0", "dequantize", "dequantize=maybe"):
        with pytest.raises(ValueError, match="AGOQ_CUDA_VEC16"):
            parse_vec16(bad)


def test_register_caps_env(monkeypatch):
    """AGOQ_CUDA_MAXNREG: the MAXNREG table by default, none when off, rules on top of the table (0 removes one);
    a GPU launch gets the cap of its (op, format, tile), a CPU (interpreter) launch never does."""
    assert parse_maxnreg(None) == parse_maxnreg("auto") == MAXNREG and MAXNREG
    assert parse_maxnreg("off") == parse_maxnreg("0") == {}
    (op, fmt, vec16), cap = next(iter(MAXNREG.items()))
    assert (op, fmt, vec16) not in parse_maxnreg(f"{op}:{fmt}=0")
    rules = parse_maxnreg("silu_mul_backward:nf4:vec16=64, rmsnorm_quant:int6:generic=72")
    assert rules[("silu_mul_backward", "nf4", True)] == 64 and ("silu_mul_backward", "nf4", False) not in rules
    assert rules[("rmsnorm_quant", "int6", False)] == 72 and rules[(op, fmt, vec16)] == cap
    both = parse_maxnreg("silu_mul_quant:int4=80")
    assert both[("silu_mul_quant", "int4", False)] == both[("silu_mul_quant", "int4", True)] == 80
    for bad in ("quantize:int4=64", "rmsnorm_quant=64", "rmsnorm_quant:int4:wide=64", "rmsnorm_quant:int4=many",
                "rmsnorm_quant:int4=300", "rmsnorm_quant:int4"):
        with pytest.raises(ValueError, match="AGOQ_CUDA_MAXNREG"):
            parse_maxnreg(bad)
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")  # device objects only: nothing runs on them
    tile = {"VEC16": True} if vec16 else {}
    assert fused_maxnreg(op, get_format(fmt), tile, gpu) == {"maxnreg": cap}
    assert fused_maxnreg(op, get_format(fmt), tile, cpu) == {}
    assert fused_maxnreg(op, get_format(fmt), {} if vec16 else {"VEC16": True}, gpu) == {}  # the other tile
    assert fused_maxnreg(op, get_format(fmt), tile, gpu, table=False) == {}  # a prefetching norm: not the table's
    monkeypatch.setenv("AGOQ_CUDA_MAXNREG", f"{op}:{fmt}={cap + 8}")
    assert fused_maxnreg(op, get_format(fmt), tile, gpu, table=False) == {"maxnreg": cap + 8}  # but one asked for
    monkeypatch.setenv("AGOQ_CUDA_MAXNREG", f"{op}:{fmt}={cap}")
    assert fused_maxnreg(op, get_format(fmt), tile, gpu, table=False) == {"maxnreg": cap}  # even the table's value
    assert parse_maxnreg(f"{op}:{fmt}={cap}", False) == {(op, fmt, t): cap for t in (False, True)}
    monkeypatch.setenv("AGOQ_CUDA_MAXNREG", "off")
    assert fused_maxnreg(op, get_format(fmt), tile, gpu) == {}
    monkeypatch.setenv("AGOQ_CUDA_MAXNREG", "silu_mul_backward:nf4:vec16=64")
    assert fused_maxnreg("silu_mul_backward", get_format("nf4"), {"VEC16": True}, gpu) == {"maxnreg": 64}
    monkeypatch.setenv("AGOQ_CUDA_MAXNREG", "silu_mul_backward:nf4:vec16")
    with pytest.raises(ValueError, match="AGOQ_CUDA_MAXNREG"):
        fused_maxnreg("silu_mul_backward", get_format("nf4"), {"VEC16": True}, gpu)


def test_norm_prefetch_words_env(monkeypatch):
    """AGOQ_CUDA_NORM_PREFETCH_WORDS: NORM_PREFETCH_WORDS by default, a list of formats, none; a name that is not a
    format is an error, not a silent no-op."""
    from agoq_cuda.launch import NORM_PREFETCH_WORDS, _parse_format_set, norm_prefetch_words

    assert NORM_PREFETCH_WORDS and all(norm_prefetch_words(f) for f in NORM_PREFETCH_WORDS)
    assert not norm_prefetch_words("int8")  # int8 does not prefetch (NORM_PREFETCH)
    monkeypatch.setenv("AGOQ_CUDA_NORM_PREFETCH_WORDS", "int8, nf4")
    assert norm_prefetch_words("int8") and norm_prefetch_words("nf4") and not norm_prefetch_words("mxfp4")
    monkeypatch.setenv("AGOQ_CUDA_NORM_PREFETCH_WORDS", "none")
    assert not any(norm_prefetch_words(f) for f in NORM_PREFETCH_WORDS)
    assert (_parse_format_set("auto", NORM_PREFETCH_WORDS, "AGOQ_CUDA_NORM_PREFETCH_WORDS")
            == _parse_format_set("", NORM_PREFETCH_WORDS, "AGOQ_CUDA_NORM_PREFETCH_WORDS") == NORM_PREFETCH_WORDS)
    monkeypatch.setenv("AGOQ_CUDA_NORM_PREFETCH_WORDS", "int4,nf5")
    with pytest.raises(ValueError, match="AGOQ_CUDA_NORM_PREFETCH_WORDS.*nf5"):
        norm_prefetch_words("int4")


def test_backward_pairs_its_roundings_where_asked(monkeypatch, device):
    """The 16-lane SiLU&Mul backward pairs its bf16 roundings (fused_swiglu._round_pair) for the formats of
    AGOQ_CUDA_BACKWARD_PAIRED (default BACKWARD_PAIRED_ROUNDING: none, slower on the H100), and nowhere with
    AGOQ_CUDA_PACKED_MAX=0; the launch passes PAIRED on the 16-lane tile only."""
    import agoq_cuda.fused_swiglu as fs
    from agoq_cuda import launch

    assert launch.BACKWARD_PAIRED_ROUNDING == frozenset()
    assert not launch.backward_pairs("nf4")
    monkeypatch.setenv("AGOQ_CUDA_BACKWARD_PAIRED", "nf4")
    assert launch.backward_pairs("nf4") and not launch.backward_pairs("int4")
    seen = []
    real = fs.LAUNCHER.launch
    monkeypatch.setattr(fs.LAUNCHER, "launch", lambda k, g, a, c: (seen.append((c.get("VEC16", False), c["PAIRED"])),
                                                                   real(k, g, a, c)))
    dh = torch.randn(2, 256).to(torch.bfloat16).to(device)
    for fmt in ("nf4", "int4"):
        spec = get_format(fmt)
        codes = [torch.zeros(spec.code_bytes(dh.numel()), dtype=torch.uint8, device=device) for _ in range(2)]
        scales = [torch.ones(spec.num_blocks(dh.numel()), device=device) for _ in range(2)]
        for vec16 in (True, False):
            fs.silu_mul_backward_into(dh, codes[0], scales[0], codes[1], scales[1], spec,
                                      *[torch.empty_like(dh) for _ in range(3)], vec16=vec16)
    assert seen == [(True, True), (False, False), (True, False), (False, False)]
    monkeypatch.setattr(fs.LAUNCHER.geometry, "packed_max", False)
    assert not launch.backward_pairs("nf4")
    monkeypatch.setattr(fs.LAUNCHER.geometry, "packed_max", True)
    monkeypatch.setenv("AGOQ_CUDA_BACKWARD_PAIRED", "none")
    assert not launch.backward_pairs("nf4")
    monkeypatch.setenv("AGOQ_CUDA_BACKWARD_PAIRED", "nf4,nf7")
    with pytest.raises(ValueError, match="AGOQ_CUDA_BACKWARD_PAIRED.*nf7"):
        launch.backward_pairs("nf4")


def _vec16(geo, op, fmt):
    return geo.plan(op, get_format(fmt), 4096, torch.bfloat16, torch.device("cpu"), rows=None, programs=None).vec16


def test_rules_defaults_and_rule(monkeypatch):
    auto = CudaGeometry(vec16="auto")
    assert _vec16(auto, "dequantize", "int5") and _vec16(auto, "quantize", "int4")
    # the measured table (2026-12-02): dequantize of 4/8-bit codes is faster on the generic tile
    assert not _vec16(auto, "dequantize", "int8") and not _vec16(auto, "dequantize", "fp8_e4m3")
    assert _vec16(auto, "quantize", "int8") and _vec16(auto, "accumulate", "fp8_e4m3")
    assert _vec16(auto, "reduce_requantize", "int8") and not _vec16(auto, "reduce_requantize", "int4")
    g = CudaGeometry(vec16="dequantize=0,dequantize:int5=1")
    assert not _vec16(g, "dequantize", "int8") and _vec16(g, "dequantize", "int5") and _vec16(g, "quantize", "int8")
    assert _vec16(CudaGeometry(vec16="1"), "reduce_requantize", "int4")
    assert not _vec16(CudaGeometry(vec16="*:int4=0"), "accumulate", "int4")
    # the fused kernels (2026-12-02 19:00): int4 SiLU&Mul backward generic; RMSNorm+quantize 16-lane for nf4 only
    vec = auto.vec16_for
    assert not vec("silu_mul_backward", get_format("int4")) and vec("silu_mul_backward", get_format("nf4"))
    assert vec("silu_mul_quant", get_format("int4"))
    assert vec("rmsnorm_quant", get_format("nf4")) and not vec("rmsnorm_quant", get_format("int4"))
    assert CudaGeometry(vec16="rmsnorm_quant=1").vec16_for("rmsnorm_quant", get_format("int4"))
    monkeypatch.setitem(cl.VEC16_DEFAULTS, ("dequantize", "int5"), False)
    assert not _vec16(auto, "dequantize", "int5")
    assert _vec16(CudaGeometry(vec16="dequantize:int8=1"), "dequantize", "int8")  # a rule beats the table
    monkeypatch.setenv("AGOQ_CUDA_VEC16", "quantize=0")
    assert not _vec16(CudaGeometry(), "quantize", "int4")


@pytest.mark.parametrize("fmt", ["int4", "fp8_e4m3"])
def test_both_tiles_same_bits(fmt, device):
    spec = get_format(fmt)
    n = 2 * spec.block
    x = (torch.randn(n, generator=torch.Generator().manual_seed(3)) * 3).to(torch.bfloat16)
    codes, scales = ref.quantize_blocks(x, spec)
    want = ref.dequantize_blocks(codes, scales, spec, n, torch.bfloat16)
    for rule in ("dequantize=0", "dequantize=1"):
        la = Launcher(CudaGeometry(vec16=rule))
        out = torch.empty(n, dtype=torch.bfloat16, device=device)
        la.dequantize(codes.to(device), scales.to(device), spec, out)
        assert_bits_equal(out, want, f"{fmt} {rule}")


def test_bench_maxnreg_smoke(tmp_path):
    """benchmarks/bench_maxnreg.py --smoke: each AGOQ_CUDA_MAXNREG setting runs the fused kernels, writes the same
    bits, and the report names the cap each setting gives each kernel (none on the interpreter's launches, but the
    table's view of them)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    out = tmp_path / "m.json"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_maxnreg.py"), "--smoke", "--rounds", "1",
                        "--norm-formats", "fp4_e2m1", "--swiglu-formats", "nf4", "--settings", "auto", "off",
                        "silu_mul_backward:nf4:vec16=64", "--json", str(out)], capture_output=True, text=True,
                       timeout=600, env=dict(os.environ, TRITON_INTERPRET="1"))
    assert r.returncode == 0, r.stderr[-3000:]
    rows = {(x["kernel"], x["format"]): x for x in json.loads(out.read_text())["rows"]}
    assert set(rows) == {("rmsnorm_quant", "fp4_e2m1"), ("silu_mul_quant", "nf4"), ("silu_mul_backward", "nf4")}
    assert all(x["bit_identical"] and all(len(v) == 1 and v[0] > 0 for v in x["ms"].values()) for x in rows.values())
    assert rows[("rmsnorm_quant", "fp4_e2m1")]["cap"] == {"auto": 64, "off": None,
                                                          "silu_mul_backward:nf4:vec16=64": 64}
    assert rows[("silu_mul_backward", "nf4")]["cap"] == {"auto": None, "off": None,
                                                         "silu_mul_backward:nf4:vec16=64": 64}
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_maxnreg.py"), "--smoke", "--settings",
                        "rmsnorm_quant:int4=lots"], capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, TRITON_INTERPRET="1"))
    assert r.returncode != 0 and "AGOQ_CUDA_MAXNREG" in r.stderr


def test_nf4_table_switch(monkeypatch):
    """AGOQ_CUDA_NF4_LUT: the table by default, the threshold search with 0 (read when the geometry is built); a
    value that is neither is refused, not guessed."""
    monkeypatch.delenv("AGOQ_CUDA_NF4_LUT", raising=False)
    assert CudaGeometry().nf4_lut is True
    for v, want in (("0", False), ("off", False), ("1", True), (" TRUE ", True), ("", True)):
        monkeypatch.setenv("AGOQ_CUDA_NF4_LUT", v)
        assert CudaGeometry().nf4_lut is want, v
    monkeypatch.setenv("AGOQ_CUDA_NF4_LUT", "sometimes")
    with pytest.raises(ValueError, match="AGOQ_CUDA_NF4_LUT"):
        CudaGeometry()
