"""Golden cases of the microscaling formats (mxfp4, mxfp8, nvfp4; docs/formats.md §9), in a file of their own.

New formats, new cases: the main golden set (golden_v{SPEC_VERSION}.pt) is left as it is. Same case schema
and runner (agoq_conformance.runner.run_case); MANIFEST.json records this file's sha256 beside the main one.
Regenerate with ``python -m agoq_conformance.golden_mx --write``.
"""
from __future__ import annotations

import argparse
import functools
import json

import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import get_format, microscaling_formats
from agoq_conformance.golden import DATA, MANIFEST_PATH, _file_sha256
from agoq_conformance.inputs import value_classes

__all__ = ["GOLDEN_MX_PATH", "build_golden_mx", "load_golden_mx"]

MX_VERSION = 1
GOLDEN_MX_PATH = DATA / f"golden_mx_v{MX_VERSION}.pt"
_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_SEED = 20261201


def build_golden_mx() -> dict:
    tensors: dict[str, torch.Tensor] = {}
    cases: list[dict] = []
    for name in microscaling_formats():
        spec = get_format(name)
        for cls, x32 in value_classes(spec, spec.block, _SEED + spec.block).items():
            for dname, dt in _DTYPES.items():
                key = f"{name}/b{spec.block}/{cls}/{dname}"
                x = x32.to(dt)
                codes, scales = ref.quantize_blocks(x, spec)
                tensors.update({f"{key}/x": x, f"{key}/codes": codes, f"{key}/scales": scales})
                cases.append({"id": f"quantize/{key}", "op": "quantize", "fmt": name, "block": spec.block,
                              "input": f"{key}/x", "expect": [f"{key}/codes", f"{key}/scales"]})
                if dname != "f32" or cls not in ("gauss", "special", "ties"):
                    continue
                for oname, odt in _DTYPES.items():
                    tensors[f"{key}/deq_{oname}"] = ref.dequantize_blocks(codes, scales, spec, x.numel(), odt)
                    cases.append({"id": f"dequantize/{key}/to_{oname}", "op": "dequantize", "fmt": name,
                                  "block": spec.block, "input": key, "numel": x.numel(), "out_dtype": oname,
                                  "expect": [f"{key}/deq_{oname}"]})
    g = torch.Generator().manual_seed(_SEED)
    spec = get_format("mxfp8")  # the block-local 8-bit one: QuanGrad's accumulate and reduce
    for n in (1000, 3 * spec.block + 8, 5):
        a = torch.randn(n, generator=g) * 1e-2
        gr = (torch.randn(n, generator=g) * 3e-3).to(torch.bfloat16)
        c0, s0 = ref.quantize_blocks(a, spec)
        c1, s1 = ref.accumulate(c0, s0, spec, n, gr)
        key = f"acc/mxfp8/n{n}/bf16"
        tensors.update({f"{key}/codes0": c0, f"{key}/scales0": s0, f"{key}/g": gr, f"{key}/codes": c1,
                        f"{key}/scales": s1})
        cases.append({"id": f"accumulate/mxfp8/n{n}/bf16", "op": "accumulate", "fmt": "mxfp8", "block": spec.block,
                      "numel": n, "input": key, "expect": [f"{key}/codes", f"{key}/scales"]})
    for w in (2, 3):
        n = 4 * spec.block + 24
        qs = [ref.quantize_blocks(torch.randn(n, generator=g) * (r + 1) * 1e-3, spec) for r in range(w)]
        codes, scales = torch.stack([c for c, _ in qs]), torch.stack([s for _, s in qs])
        c1, s1 = ref.reduce_requantize(codes, scales, spec, n)
        key = f"red/mxfp8/w{w}"
        tensors.update({f"{key}/codes_in": codes, f"{key}/scales_in": scales, f"{key}/codes": c1, f"{key}/scales": s1})
        cases.append({"id": f"reduce_requantize/mxfp8/w{w}", "op": "reduce_requantize", "fmt": "mxfp8",
                      "block": spec.block, "numel": n, "input": key, "expect": [f"{key}/codes", f"{key}/scales"]})
    return {"mx_version": MX_VERSION, "cases": cases, "tensors": tensors}


@functools.cache
def load_golden_mx() -> dict:
    manifest = json.loads(MANIFEST_PATH.read_text())
    want = manifest["files"].get(GOLDEN_MX_PATH.name, {}).get("sha256")
    got = _file_sha256(GOLDEN_MX_PATH)
    if got != want:
        raise RuntimeError(f"golden set {GOLDEN_MX_PATH.name}: sha256 {got} != manifest {want}; regenerate with "
                           "python -m agoq_conformance.golden_mx --write")
    return torch.load(GOLDEN_MX_PATH, weights_only=True)


def _write() -> None:
    g = build_golden_mx()
    torch.save(g, GOLDEN_MX_PATH)
    manifest = json.loads(MANIFEST_PATH.read_text())
    manifest["files"][GOLDEN_MX_PATH.name] = {"sha256": _file_sha256(GOLDEN_MX_PATH),
                                              "bytes": GOLDEN_MX_PATH.stat().st_size, "cases": len(g["cases"])}
    MANIFEST_PATH.write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {GOLDEN_MX_PATH} ({GOLDEN_MX_PATH.stat().st_size} bytes, {len(g['cases'])} cases)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true")
    if ap.parse_args().write:
        _write()
