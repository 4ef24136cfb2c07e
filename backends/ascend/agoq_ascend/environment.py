"""Is this an Ascend machine that can run the backend? Answered from files and variables only.

Never imports torch_npu or triton: torch_npu raises at import without CANN (``libhccl.so: cannot open
shared object file``) and triton-ascend installs a module named ``triton``, so importing either to
find out would be the failure we are diagnosing. Each check returns a :class:`Finding` that says what
was found and, when something is missing, the exact fix.

Checks (all run, so one message lists every missing piece):

1. ``torch_npu`` is installed (``PathFinder.find_spec``) and its distribution pins the installed torch
   release (torch_npu 2.13.0 requires ``torch==2.13.0.*``); torch is a CPU build (torch_npu refuses to
   load next to CUDA: "Two accelerators cannot be used at the same time").
2. The importable ``triton`` package is Triton-Ascend (it ships ``triton/backends/ascend``), the
   ``triton-ascend`` distribution is installed, and upstream ``triton`` is not (they overwrite each
   other's files).
3. CANN is loaded: ``ASCEND_HOME_PATH`` or ``ASCEND_TOOLKIT_HOME`` points at a directory, a
   ``set_env.sh`` can be found, and ``libascendcl.so`` / ``libhccl.so`` are on ``LD_LIBRARY_PATH``.
   Libraries in the dynamic loader's cache count as found (containers register CANN there), and a library
   found nowhere is only a warning once CANN itself is loaded. The CANN version is read from its version
   files and reported; a torch_npu / triton-ascend / CANN combination outside the published tables is a
   warning. CANN's ``bishengir-compile`` must be on ``PATH`` (triton-ascend compiles every kernel with it).
4. The driver is there: ``/dev/davinci*`` device nodes, not hidden by ``ASCEND_RT_VISIBLE_DEVICES``;
   ``npu-smi`` on ``PATH`` (a warning only when the device nodes exist: containers often lack it).

Machines without CANN: torch_npu registers a ``torch.backends`` entry point, so ``import torch`` imports it
and fails there; ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns that off (docs/backends/ascend.md).
"""
from __future__ import annotations

import glob
import importlib.machinery
import importlib.metadata as md
import os
import re
import shutil
import sys
from ctypes.util import find_library
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

__all__ = ["Finding", "check_environment", "summarize", "torch_release", "set_env_candidates"]

DOCS = "docs/backends/ascend.md"
_DEFAULT_CANN_ROOTS = ("/usr/local/Ascend", os.path.expanduser("~/Ascend"))


@dataclass(frozen=True, slots=True)
class Finding:
    """One check: ``ok``, what was found (``what``) and, if not ok, how to fix it (``fix``)."""

    name: str
    ok: bool
    what: str
    fix: str = ""
    warning: bool = False
    """ok, but worth saying (an untested version combination, a library found off LD_LIBRARY_PATH ...)."""

    def line(self) -> str:
        return f"{self.name}: {self.what}" + ("" if self.ok and not self.fix else f" -> fix: {self.fix}")


def torch_release(version: str) -> str:
    """'2.13.0+cpu' -> '2.13.0' (the public release torch_npu pins)."""
    return version.split("+", 1)[0]


def _dist(name: str, path: Sequence[str]) -> md.Distribution | None:
    want = re.sub(r"[-_.]+", "-", name).lower()
    for dist in md.distributions(path=list(path)):
        got = re.sub(r"[-_.]+", "-", dist.metadata.get("Name", "") or "").lower()
        if got == want:
            return dist
    return None


def _torch_pin(dist: md.Distribution) -> str | None:
    """The torch release a torch_npu distribution requires ('2.13.0' from 'torch==2.13.0.*')."""
    for req in dist.requires or ():
        m = re.match(r"^\s*torch\s*(?:\[[^]]*\])?\s*==\s*([0-9]+(?:\.[0-9]+)*)", req)
        if m and ";" not in req.split("==", 1)[0]:
            return m.group(1).rstrip(".")
    return None


def _check_torch_npu(path: Sequence[str], torch_version: str, torch_cuda: str | None) -> list[Finding]:
    rel = torch_release(torch_version)
    out = []
    if torch_cuda:
        out.append(Finding(
            "torch", False, f"torch {torch_version} is a CUDA {torch_cuda} build; torch_npu refuses to load next to "
            "another accelerator ('Two accelerators cannot be used at the same time')",
            f"install the CPU build: pip install torch=={rel} --index-url https://download.pytorch.org/whl/cpu"))
    spec = importlib.machinery.PathFinder.find_spec("torch_npu", list(path))
    dist = _dist("torch-npu", path)
    if spec is None and dist is None:
        out.append(Finding("torch_npu", False, f"torch_npu is not installed (torch is {torch_version})",
                           f"pip install torch-npu=={rel} (torch_npu pins one torch release; this one matches "
                           f"torch {rel}. Its CANN version is in Ascend/pytorch COMPATIBILITY.md)"))
        return out
    ver = dist.version if dist is not None else "unknown version"
    pin = _torch_pin(dist) if dist is not None else None
    if pin is None and dist is not None:
        pin = torch_release(re.sub(r"\.post\d+$", "", dist.version))  # 2.8.0.post2 -> torch 2.8.0
    if pin is not None and not (rel == pin or rel.startswith(pin + ".")):
        out.append(Finding("torch_npu", False, f"torch_npu {ver} requires torch {pin} but torch {torch_version} is "
                           "installed (a mismatch fails with undefined symbols at import)",
                           f"pip install torch-npu=={rel} (or pip install torch=={pin} with the CPU index)"))
    else:
        out.append(Finding("torch_npu", True, f"torch_npu {ver} installed for torch {pin or rel}"))
    return out


def _check_triton(path: Sequence[str]) -> list[Finding]:
    spec = importlib.machinery.PathFinder.find_spec("triton", list(path))
    ascend = _dist("triton-ascend", path)
    upstream = _dist("triton", path)
    pkg_dirs = list(spec.submodule_search_locations or []) if spec is not None else []
    has_ascend_backend = any(os.path.isdir(os.path.join(d, "backends", "ascend")) for d in pkg_dirs)
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheels = "" if sys.version_info[:2] <= (3, 11) else (
        f" (triton-ascend ships wheels for Python 3.9-3.11 only; this is Python {py}: use a 3.11 venv)")
    if ascend is not None and upstream is not None:
        return [Finding("triton", False, f"both triton-ascend {ascend.version} and upstream triton {upstream.version} "
                        "are installed; they install the same 'triton' package and overwrite each other's files",
                        "pip uninstall -y triton triton-ascend && pip install triton-ascend" + wheels)]
    if upstream is not None or (spec is not None and not has_ascend_backend):
        found = f"upstream triton {upstream.version}" if upstream is not None else "a 'triton' package without " \
            "backends/ascend"
        return [Finding("triton", False, f"{found} is installed; Ascend needs triton-ascend instead (the same "
                        "'triton' module, built for NPUs)",
                        "in a venv without upstream triton: pip uninstall -y triton && pip install triton-ascend"
                        + wheels)]
    if spec is None or ascend is None:
        return [Finding("triton", False, "triton-ascend is not installed",
                        "pip install triton-ascend (into a venv without upstream triton)" + wheels)]
    if not has_ascend_backend:
        return [Finding("triton", False, f"triton-ascend {ascend.version} is installed but triton/backends/ascend is "
                        "missing (overwritten by another triton?)",
                        "pip uninstall -y triton triton-ascend && pip install triton-ascend")]
    return [Finding("triton", True, f"triton-ascend {ascend.version}")]


def set_env_candidates(env: Mapping[str, str], roots: Sequence[str] = _DEFAULT_CANN_ROOTS) -> list[str]:
    """Where CANN's set_env.sh usually is: next to or above ASCEND_*_HOME, or under the default roots
    (CANN 8.0: <root>/ascend-toolkit/set_env.sh; CANN 8.5+: <root>/cann/set_env.sh)."""
    cands = []
    for var in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH"):
        base = env.get(var)
        if base:
            cands += [os.path.join(base, "set_env.sh"), os.path.join(os.path.dirname(base.rstrip("/")), "set_env.sh")]
    for root in roots:
        cands += [os.path.join(root, "ascend-toolkit", "set_env.sh"), os.path.join(root, "cann", "set_env.sh")]
    return list(dict.fromkeys(cands))


def _check_cann(env: Mapping[str, str], roots: Sequence[str]) -> list[Finding]:
    found_sh = [p for p in set_env_candidates(env, roots) if os.path.isfile(p)]
    source = f"source {found_sh[0]}" if found_sh else (
        "install the CANN toolkit that matches your torch_npu (Ascend/pytorch COMPATIBILITY.md), then "
        "source /usr/local/Ascend/ascend-toolkit/set_env.sh (CANN 8.5+: /usr/local/Ascend/cann/set_env.sh)")
    out = []
    homes = [(v, env[v]) for v in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME") if env.get(v)]
    if not homes:
        where = f"set_env.sh found at {found_sh[0]} but not sourced" if found_sh else "no CANN set_env.sh found in " \
            + ", ".join(set_env_candidates(env, roots))
        out.append(Finding("CANN", False, f"CANN environment not loaded: ASCEND_HOME_PATH and ASCEND_TOOLKIT_HOME "
                           f"are unset ({where})", source))
    else:
        missing = [f"{v}={p}" for v, p in homes if not os.path.isdir(p)]
        if missing:
            out.append(Finding("CANN", False, f"{', '.join(missing)} is not a directory", source))
        else:
            out.append(Finding("CANN", True, ", ".join(f"{v}={p}" for v, p in homes)
                               + (f"; set_env.sh at {found_sh[0]}" if found_sh else "")))
    ld = [d for d in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    extra = []
    for _, p in homes:
        extra += [os.path.join(p, sub) for sub in ("lib64", "runtime/lib64", "x86_64-linux/lib64",
                                                    "aarch64-linux/lib64")]
    cann_ok = all(f.ok for f in out)
    lib_fix = source if cann_ok else "the CANN fix above (set_env.sh puts it on LD_LIBRARY_PATH)"
    for lib, package in (("libascendcl.so", "runtime"), ("libhccl.so", "HCCL")):
        on_ld = [d for d in ld if os.path.isfile(os.path.join(d, lib))]
        elsewhere = [d for d in extra if os.path.isfile(os.path.join(d, lib))]
        cached = find_library(lib.removeprefix("lib").removesuffix(".so"))
        if on_ld:
            out.append(Finding(lib, True, f"{lib} in {on_ld[0]}"))
        elif cached:
            # containers often register CANN in the loader cache (/etc/ld.so.conf.d) instead of LD_LIBRARY_PATH
            out.append(Finding(lib, True, f"{lib} in the dynamic loader's cache ({cached})"))
        elif elsewhere:
            out.append(Finding(lib, True, f"{lib} is in {elsewhere[0]} but neither on LD_LIBRARY_PATH nor in the loader "
                               "cache; torch_npu loads it by name, which works only if something else (an RPATH, a "
                               "container hook) finds it", lib_fix, warning=True))
        elif cann_ok:
            out.append(Finding(lib, True, f"{lib} not found on LD_LIBRARY_PATH, in the loader cache or under the CANN "
                               f"home (CANN {package} package); if torch_npu's import fails with '{lib}: cannot open "
                               "shared object file', that is why", lib_fix, warning=True))
        else:
            out.append(Finding(lib, False, f"{lib} not found (CANN {package} package; torch_npu's import fails "
                               f"with '{lib}: cannot open shared object file')", lib_fix))
    out += _check_cann_version(homes)
    return out


def cann_version(homes: Sequence[tuple[str, str]]) -> str | None:
    """CANN version from the toolkit's version files (``<home>/{,compiler/,runtime/}version.info``: Version=8.3.RC1;
    ``<home>/version.cfg``), or None."""
    for _, home in homes:
        for rel in ("version.info", "compiler/version.info", "runtime/version.info", "toolkit/version.info"):
            f = os.path.join(home, rel)
            if os.path.isfile(f):
                m = re.search(r"^\s*[Vv]ersion\s*=\s*([0-9][\w.\-]*)", _read(f), re.M)
                if m:
                    return m.group(1)
        f = os.path.join(home, "version.cfg")
        if os.path.isfile(f):
            m = re.search(r"version\s*=\s*\[?([0-9][\w.\-]*)", _read(f))
            if m:
                return m.group(1)
    return None


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read(65536)
    except OSError:
        return ""


# Published pairings (triton-ascend README: 3.2.0 <-> CANN 8.5.0, 3.2.0rc4 <-> CANN 8.3.RC1/RC2; Ascend/pytorch
# COMPATIBILITY.md, e.g. torch_npu 2.12.0 <-> CANN 9.1.0). Prefixes: a CANN "8.5.0.1" matches "8.5.0".
TRITON_ASCEND_CANN = {"3.2.0": ("8.5.0",), "3.2.0rc4": ("8.3.RC1", "8.3.RC2")}
TORCH_NPU_CANN = {"2.12.0": ("9.1.0",)}


def _cann_matches(version: str, wanted: Sequence[str]) -> bool:
    return any(version == w or version.startswith(w + ".") for w in wanted)


def compatibility_warnings(cann: str | None, triton_ascend: str | None, torch_npu: str | None) -> list[str]:
    """Combinations outside the published tables, one line each (warnings: newer releases may be fine)."""
    out = []
    if cann is None:
        return out
    if triton_ascend in TRITON_ASCEND_CANN and not _cann_matches(cann, TRITON_ASCEND_CANN[triton_ascend]):
        out.append(f"triton-ascend {triton_ascend} is published for CANN {' / '.join(TRITON_ASCEND_CANN[triton_ascend])}, "
                   f"this is CANN {cann}")
    npu = torch_release(torch_npu) if torch_npu else None
    if npu in TORCH_NPU_CANN and not _cann_matches(cann, TORCH_NPU_CANN[npu]):
        out.append(f"torch_npu {torch_npu} is published for CANN {' / '.join(TORCH_NPU_CANN[npu])}, this is CANN {cann}")
    return out


def _check_cann_version(homes: Sequence[tuple[str, str]]) -> list[Finding]:
    if not homes:
        return []
    ver = cann_version(homes)
    if ver is None:
        return [Finding("CANN version", True, "CANN version unknown (no version.info / version.cfg under "
                        f"{homes[0][1]})", warning=True)]
    return [Finding("CANN version", True, f"CANN {ver}")]


def _check_bishengir(env: Mapping[str, str], which: Callable[[str], str | None]) -> list[Finding]:
    """triton-ascend compiles every kernel with CANN's bishengir-compile (found on PATH, or as
    $TRITON_NPU_COMPILER_PATH/npuc): without it no kernel compiles."""
    homes = [(v, env[v]) for v in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME") if env.get(v)]
    hit = which("bishengir-compile")
    root = env.get("TRITON_NPU_COMPILER_PATH")
    if hit is None and root and os.path.isfile(os.path.join(root, "npuc")):
        hit = os.path.join(root, "npuc")
    if hit:
        return [Finding("bishengir-compile", True, f"bishengir-compile at {hit}")]
    under = [os.path.join(h, sub, "bishengir-compile") for _, h in homes
             for sub in ("bin", "compiler/bishengir/bin", "tools/bishengir/bin")]
    found = next((f for f in under if os.path.isfile(f)), None)
    fix = (f"export PATH={os.path.dirname(found)}:$PATH" if found else
           "install the CANN toolkit (it ships bishengir-compile) and source its set_env.sh, which puts it on PATH")
    return [Finding("bishengir-compile", False, "bishengir-compile (CANN's BiSheng compiler, which triton-ascend runs "
                    "for every kernel) is not on PATH" + (f"; it is at {found}" if found else ""), fix)]


def _check_driver(env: Mapping[str, str], which: Callable[[str], str | None], dev_glob: str) -> list[Finding]:
    out = []
    smi = which("npu-smi")
    if smi:
        out.append(Finding("npu-smi", True, f"npu-smi at {smi}"))
    nodes = sorted(glob.glob(dev_glob))
    if not smi:
        # torch_npu does not need npu-smi; a container with /dev/davinci* and the driver libraries works without it
        out.append(Finding("npu-smi", bool(nodes), "npu-smi is not on PATH (no Ascend driver on this machine, or not "
                           "mounted into this container)" + ("; not needed: device nodes are present" if nodes else ""),
                           "install the Ascend NPU driver and firmware (or run the container with "
                           "/usr/local/Ascend/driver and /dev/davinci* mounted)", warning=bool(nodes)))
    vis = env.get("ASCEND_RT_VISIBLE_DEVICES")
    if not nodes:
        out.append(Finding("devices", False, f"no NPU device node ({dev_glob})",
                           "run on an Ascend machine (or pass --device=/dev/davinciN to the container)"))
    elif vis is not None and not vis.strip():
        out.append(Finding("devices", False, "ASCEND_RT_VISIBLE_DEVICES is set but empty: every NPU is hidden",
                           "unset ASCEND_RT_VISIBLE_DEVICES or list device ids, e.g. ASCEND_RT_VISIBLE_DEVICES=0"))
    else:
        out.append(Finding("devices", True, f"{len(nodes)} NPU device node(s)"))
    return out


def check_environment(*, env: Mapping[str, str] | None = None, path: Sequence[str] | None = None,
                      torch_version: str | None = None, torch_cuda: str | None = "<detect>",
                      which: Callable[[str], str | None] = shutil.which, dev_glob: str = "/dev/davinci[0-9]*",
                      cann_roots: Sequence[str] = _DEFAULT_CANN_ROOTS) -> list[Finding]:
    """Every check of the module docstring. Arguments default to this process (tests inject fakes)."""
    env = os.environ if env is None else env
    path = sys.path if path is None else path
    if torch_version is None or torch_cuda == "<detect>":
        import torch  # already imported by agoq_core; reading versions touches no device

        torch_version = torch_version or torch.__version__
        torch_cuda = getattr(torch.version, "cuda", None) if torch_cuda == "<detect>" else torch_cuda
    found = (_check_torch_npu(path, torch_version, torch_cuda) + _check_triton(path) + _check_cann(env, cann_roots)
             + _check_bishengir(env, which) + _check_driver(env, which, dev_glob))
    cann = next((f.what.removeprefix("CANN ") for f in found if f.name == "CANN version" and not f.warning), None)
    ta, npu = _dist("triton-ascend", path), _dist("torch-npu", path)
    for w in compatibility_warnings(cann, ta.version if ta else None, npu.version if npu else None):
        found.append(Finding("compatibility", True, w + " (outside the published compatibility tables)",
                             "install the pairing from triton-ascend's README / Ascend/pytorch COMPATIBILITY.md if "
                             "compilation or import fails", warning=True))
    return found


def summarize(findings: Sequence[Finding]) -> str:
    """One message: every missing piece with its fix, then warnings, then what is fine."""
    bad = [f for f in findings if not f.ok]
    warn = [f for f in findings if f.ok and f.warning]
    good = [f for f in findings if f.ok and not f.warning]
    if not bad:
        return "Ascend environment complete: " + "; ".join(f.what for f in good) + "".join(
            f"\n  warning: {f.line()}" for f in warn)
    lines = [f"the Ascend runtime is incomplete ({len(bad)} problem{'s' * (len(bad) > 1)}):"]
    lines += [f"  - {f.line()}" for f in bad]
    lines += [f"  warning: {f.line()}" for f in warn]
    if good:
        lines.append("  found: " + "; ".join(f.what for f in good))
    lines.append(f"  (install guide: {DOCS}; to run the kernels on CPU instead: "
                 "AGOQ_ASCEND_INTERPRET=1 TRITON_INTERPRET=1)")
    return "\n".join(lines)
