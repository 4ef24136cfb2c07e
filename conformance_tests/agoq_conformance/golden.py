"""The golden set: inputs plus the reference backend's outputs, frozen in the repo.

Every backend is compared with these frozen bytes, never with another backend (so no machine needs
two devices). Regenerate only when the numerics contract's version changes:
``python -m agoq_conformance.golden --write`` (and commit the new file and its sha256).

Older golden sets stay in the repo for their *decode* cases (``legacy_decode_cases``): a spec version
changes how values are encoded, never how codes decode, so tensors written under an older version must
still dequantize to the same bytes on every backend (docs/formats.md §8).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
from pathlib import Path

import torch

from agoq_core.formats import reference as ref
from agoq_core.formats.spec import SPEC_VERSION, get_format, gradient_formats, list_formats
from agoq_conformance.inputs import value_classes

__all__ = ["GOLDEN_PATH", "MANIFEST_PATH", "LEGACY_VERSIONS", "build_golden", "load_golden", "golden_sha256",
           "load_legacy_golden", "legacy_decode_cases"]

DATA = Path(__file__).parent / "data"
GOLDEN_PATH = DATA / f"golden_v{SPEC_VERSION}.pt"
MANIFEST_PATH = DATA / "MANIFEST.json"
#: Older spec versions whose golden set is kept for its decode cases (v2: the last one that divided per element).
LEGACY_VERSIONS = (2,)

_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_SEED = 20261129


def _blocks_for(spec) -> list[int]:
    # the default block plus one small and one non-power-of-two block (both multiples of 8)
    return sorted({spec.block, 32, 264})


def build_golden() -> dict:
    """Compute every case with the pure-torch reference (CPU). Deterministic."""
    tensors: dict[str, torch.Tensor] = {}
    cases: list[dict] = []
    for spec0 in list_formats():
        for block in _blocks_for(spec0):
            spec = spec0.with_block(block)
            for cls, x32 in value_classes(spec, block, _SEED + block).items():
                for dname, dt in _DTYPES.items():
                    x = x32.to(dt)
                    key = f"{spec.name}/b{block}/{cls}/{dname}"
                    codes, scales = ref.quantize_blocks(x, spec)
                    tensors[f"{key}/x"] = x
                    tensors[f"{key}/codes"] = codes
                    tensors[f"{key}/scales"] = scales
                    cases.append({"id": f"quantize/{key}", "op": "quantize", "fmt": spec.name, "block": block,
                                  "input": f"{key}/x", "expect": [f"{key}/codes", f"{key}/scales"]})
                    # dequantize the golden codes to each output dtype
                    for oname, odt in _DTYPES.items():
                        if cls not in ("gauss", "special", "ties") or dname != "f32":
                            continue
                        out = ref.dequantize_blocks(codes, scales, spec, x.numel(), odt)
                        tensors[f"{key}/deq_{oname}"] = out
                        cases.append({"id": f"dequantize/{key}/to_{oname}", "op": "dequantize", "fmt": spec.name,
                                      "block": block, "input": f"{key}", "numel": x.numel(), "out_dtype": oname,
                                      "expect": [f"{key}/deq_{oname}"]})
    g = torch.Generator().manual_seed(_SEED)
    for name in gradient_formats():
        spec = get_format(name)
        for n in (1000, 3 * spec.block + 8, 5):
            for gname in ("f32", "bf16"):
                a = torch.randn(n, generator=g) * 1e-2
                gr = (torch.randn(n, generator=g) * 3e-3).to(_DTYPES[gname])
                if n == 1000:
                    gr[17] = float("nan") if gname == "f32" else gr[17]  # a non-finite grad poisons its block only
                c0, s0 = ref.quantize_blocks(a, spec)
                c1, s1 = ref.accumulate(c0, s0, spec, n, gr)
                key = f"{name}/n{n}/{gname}"
                tensors.update({f"acc/{key}/codes0": c0, f"acc/{key}/scales0": s0, f"acc/{key}/g": gr,
                                f"acc/{key}/codes": c1, f"acc/{key}/scales": s1})
                cases.append({"id": f"accumulate/{key}", "op": "accumulate", "fmt": name, "block": spec.block,
                              "numel": n, "input": f"acc/{key}", "expect": [f"acc/{key}/codes", f"acc/{key}/scales"]})
        for w in (2, 3, 4):
            n = 4 * spec.block + 24
            parts = [torch.randn(n, generator=g) * (r + 1) * 1e-3 for r in range(w)]
            qs = [ref.quantize_blocks(p, spec) for p in parts]
            codes = torch.stack([c for c, _ in qs])
            scales = torch.stack([s for _, s in qs])
            c1, s1 = ref.reduce_requantize(codes, scales, spec, n)
            key = f"{name}/w{w}"
            tensors.update({f"red/{key}/codes_in": codes, f"red/{key}/scales_in": scales,
                            f"red/{key}/codes": c1, f"red/{key}/scales": s1})
            cases.append({"id": f"reduce_requantize/{key}", "op": "reduce_requantize", "fmt": name,
                          "block": spec.block, "numel": n, "input": f"red/{key}",
                          "expect": [f"red/{key}/codes", f"red/{key}/scales"]})
    _protocol_cases(g, tensors, cases)
    return {"spec_version": SPEC_VERSION, "cases": cases, "tensors": tensors}


def _protocol_cases(g: torch.Generator, tensors: dict, cases: list) -> None:
    """QuanGrad's all-reduce and reduce-scatter, simulated in one process: every wire payload byte
    (all-to-all and all-gather send buffers) and every rank's result."""
    from agoq_core.quangrad.protocol import resolve_spec, simulate_all_reduce, simulate_reduce_scatter

    for name in gradient_formats():
        spec = resolve_spec(name, None)  # QuanGrad's default block for this format
        for w, n, dname in ((2, 1031, "f32"), (4, 4 * spec.block * 4 + 40, "bf16"), (3, 7, "f32")):
            ranks = [(torch.randn(n, generator=g) * 10.0 ** -(r + 2)).to(_DTYPES[dname]) for r in range(w)]
            key = f"proto/{name}/w{w}/n{n}/{dname}"
            tensors[f"{key}/x"] = torch.stack(ranks)
            ar = simulate_all_reduce(ranks, spec, backend="reference")
            tensors[f"{key}/a2a"] = torch.stack([p.all_to_all for p in ar.payloads])
            tensors[f"{key}/ag"] = torch.stack([p.all_gather for p in ar.payloads])
            tensors[f"{key}/result"] = torch.stack(ar.results)
            cases.append({"id": f"protocol_all_reduce/{name}/w{w}/n{n}/{dname}", "op": "protocol_all_reduce",
                          "fmt": name, "block": spec.block, "input": f"{key}/x",
                          "expect": [f"{key}/a2a", f"{key}/ag", f"{key}/result"]})
            rs = simulate_reduce_scatter(ranks, spec, backend="reference")
            tensors[f"{key}/rs_a2a"] = torch.stack(rs.payloads)
            tensors[f"{key}/rs_shards"] = torch.stack(rs.shards)
            cases.append({"id": f"protocol_reduce_scatter/{name}/w{w}/n{n}/{dname}", "op": "protocol_reduce_scatter",
                          "fmt": name, "block": spec.block, "input": f"{key}/x",
                          "expect": [f"{key}/rs_a2a", f"{key}/rs_shards"]})


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@functools.cache
def golden_sha256() -> str:
    return _file_sha256(GOLDEN_PATH)


def _load_checked(path: Path) -> dict:
    if not path.exists():
        raise FileNotFoundError(f"golden set {path} is missing; reinstall agoq-conformance")
    manifest = json.loads(MANIFEST_PATH.read_text())
    want = manifest["files"][path.name]["sha256"]
    got = golden_sha256() if path == GOLDEN_PATH else _file_sha256(path)
    if got != want:
        raise RuntimeError(f"golden set {path.name} is corrupt or modified: sha256 {got} != manifest {want}")
    return torch.load(path, weights_only=True)


@functools.cache
def load_golden() -> dict:
    """Load the committed golden set after checking its sha256 against MANIFEST.json."""
    return _load_checked(GOLDEN_PATH)


@functools.cache
def load_legacy_golden(version: int) -> dict:
    """The kept golden set of an older spec version (sha256-checked like the current one)."""
    if version not in LEGACY_VERSIONS:
        raise ValueError(f"no kept golden set for spec version {version}; kept: {LEGACY_VERSIONS}")
    return _load_checked(DATA / f"golden_v{version}.pt")


def legacy_decode_cases() -> list[tuple[dict, int]]:
    """(case, version): every dequantize case of the kept older golden sets, ids prefixed ``v{version}/``. Their
    codes and scales were written under that version; decoding them must give the same bytes today."""
    out = []
    for v in LEGACY_VERSIONS:
        for c in load_legacy_golden(v)["cases"]:
            if c["op"] == "dequantize":
                out.append((dict(c, id=f"v{v}/{c['id']}"), v))
    return out


def _write() -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    g = build_golden()
    torch.save(g, GOLDEN_PATH)
    # keep the entries of the other golden files (golden_mx_*.pt) and of the kept older versions of this one
    # (LEGACY_VERSIONS, for their decode cases); drop the others
    old = json.loads(MANIFEST_PATH.read_text())["files"] if MANIFEST_PATH.exists() else {}
    kept = {f"golden_v{v}.pt" for v in LEGACY_VERSIONS}
    files = {k: v for k, v in old.items()
             if (not k.startswith("golden_v") or k in kept) and k != GOLDEN_PATH.name and (DATA / k).exists()}
    files[GOLDEN_PATH.name] = {"sha256": _file_sha256(GOLDEN_PATH), "bytes": GOLDEN_PATH.stat().st_size,
                               "cases": len(g["cases"])}
    MANIFEST_PATH.write_text(json.dumps({
        "spec_version": SPEC_VERSION,
        "generator": "agoq_conformance.golden.build_golden (reference backend, CPU, torch "
                     f"{torch.__version__})",
        "files": dict(sorted(files.items(), key=lambda kv: kv[0] != GOLDEN_PATH.name)),
    }, indent=2) + "\n")
    print(f"wrote {GOLDEN_PATH} ({GOLDEN_PATH.stat().st_size} bytes, {len(g['cases'])} cases)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--write", action="store_true", help="regenerate the golden file and MANIFEST.json")
    if ap.parse_args().write:
        _write()
