"""Plain-Python parts of agoq_triton_kernels: constexpr tables, limits, packaging promises."""
from __future__ import annotations

import pathlib
import subprocess
import sys
import tomllib

import pytest

from agoq_core.formats.spec import list_formats
from agoq_triton_kernels.layout import KIND_IDS, MAX_BLOCK, format_constexprs, next_pow2

_ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_core_format_has_a_kernel_kind():
    for spec in list_formats():
        c = format_constexprs(kind=spec.kind, bits=spec.bits, block=spec.block, qmax=spec.qmax)
        assert c["KIND"] == KIND_IDS[spec.kind]
        assert c["BLOCK_P"] >= spec.block and c["BLOCK_P"] & (c["BLOCK_P"] - 1) == 0


@pytest.mark.parametrize("n,want", [(1, 1), (8, 8), (24, 32), (128, 128), (264, 512), (8192, 8192)])
def test_next_pow2(n, want):
    assert next_pow2(n) == want


@pytest.mark.parametrize("kw,msg", [
    (dict(kind="int9", bits=4, block=128, qmax=7.0), "unknown code kind"),
    (dict(kind="int", bits=7, block=128, qmax=7.0), "bits must be"),
    (dict(kind="int", bits=4, block=12, qmax=7.0), "multiple of 8"),
    (dict(kind="int", bits=4, block=MAX_BLOCK + 8, qmax=7.0), "larger than the kernels' maximum"),
])
def test_format_constexprs_rejects_bad_input(kw, msg):
    with pytest.raises(ValueError, match=msg):
        format_constexprs(**kw)


def test_layout_imports_no_triton():
    code = ("import sys, agoq_triton_kernels, agoq_triton_kernels.layout\n"
            "assert 'triton' not in sys.modules, 'layout pulled in triton'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_distribution_does_not_depend_on_triton():
    """triton-ascend installs a module named `triton`: a declared `triton` dependency would make pip pull
    upstream triton onto Ascend machines and break them (cpu-feasibility.md §5)."""
    meta = tomllib.loads((_ROOT / "pyproject.toml").read_text())["project"]
    assert meta["name"] == "agoq-triton-kernels"
    assert not [d for d in meta.get("dependencies", []) if d.split()[0].lower().startswith("triton")]


@pytest.mark.parametrize("kind,per_unit,offset", [("nf4", 4.0, 16), ("fp4_e2m1", 4.0, 0)])
def test_bucket_tables_agree_with_thresholds(kind, per_unit, offset):
    """base_k + (v > t_k) counts the thresholds below v for values all over each bucket."""
    import struct

    import torch

    from agoq_core.formats import reference as ref
    from agoq_core.formats.spec import get_format
    from agoq_triton_kernels.layout import ENCODE_LUT_SIZE, NF4_LUT_DOMAIN, encode_lut

    table = encode_lut(kind)
    assert len(table) == ENCODE_LUT_SIZE
    spec = get_format(kind)
    lo = -1.0 if kind == "nf4" else 0.0
    hi = 1.0 if kind == "nf4" else 6.0
    v = torch.linspace(lo, hi, 20001)
    want = ref.encode(v, spec)
    dom = NF4_LUT_DOMAIN if kind == "nf4" else 1.0  # the NF4 table is in the domain of v * 4
    for i, x in enumerate((v * dom).tolist()):
        k = min(max(round(x * per_unit) + offset, 0), ENCODE_LUT_SIZE - 1)  # python round = half even
        base, tbits = table[k] >> 32, table[k] & 0xFFFFFFFF
        t = struct.unpack("<f", struct.pack("<I", tbits))[0]
        assert base + (x > t) == int(want[i]) & 7 if kind == "fp4_e2m1" else base + (x > t) == int(want[i])


def test_encode_lut_of_other_kinds_is_empty():
    from agoq_triton_kernels.layout import encode_lut

    assert set(encode_lut("int")) == {0}
