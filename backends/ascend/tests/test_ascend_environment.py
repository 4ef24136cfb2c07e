"""The probe: never imports torch_npu or triton, lists every missing piece of the Ascend runtime with its
fix, and AGOQ_BACKEND=ascend on this (NPU-less) machine fails with that message."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agoq_ascend.environment import Finding, check_environment, set_env_candidates, summarize, torch_release
from agoq_ascend.soc import UnsupportedSocError, classify


# ---- a fake, complete Ascend install on disk (files only: nothing is imported) -----------------------------
def _dist_info(site: Path, name: str, version: str, requires: list[str] = ()) -> None:
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True)
    meta = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"] + [f"Requires-Dist: {r}" for r in requires]
    (d / "METADATA").write_text("\n".join(meta) + "\n")


def _fake_install(tmp_path: Path, *, torch_pin="2.13.0", triton="ascend") -> dict:
    site = tmp_path / "site"
    (site / "torch_npu").mkdir(parents=True)
    (site / "torch_npu" / "__init__.py").write_text("raise ImportError('a probe must never import me')\n")
    _dist_info(site, "torch-npu", torch_pin, [f"torch=={torch_pin}.*", "numpy", "pyyaml"])
    pkg = site / "triton"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('a probe must never import me')\n")
    if triton in ("ascend", "both"):
        (pkg / "backends" / "ascend").mkdir(parents=True)
        _dist_info(site, "triton-ascend", "3.2.0")
    if triton in ("upstream", "both"):
        _dist_info(site, "triton", "3.6.0")
    cann = tmp_path / "Ascend" / "ascend-toolkit"
    (cann / "latest" / "lib64").mkdir(parents=True)
    (cann / "set_env.sh").write_text("export ASCEND_HOME_PATH=...\n")
    for lib in ("libascendcl.so", "libhccl.so"):
        (cann / "latest" / "lib64" / lib).write_bytes(b"\x7fELF")
    (cann / "latest" / "version.info").write_text("Version=8.5.0\nversion_dir=8.5.0\n")
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "davinci0").write_text("")
    env = {"ASCEND_HOME_PATH": str(cann / "latest"), "ASCEND_TOOLKIT_HOME": str(cann / "latest"),
           "LD_LIBRARY_PATH": str(cann / "latest" / "lib64")}
    return dict(env=env, path=[str(site)], torch_version="2.13.0+cpu", torch_cuda=None,
                which=lambda name: {"npu-smi": "/usr/local/sbin/npu-smi",
                                    "bishengir-compile": "/usr/local/Ascend/bin/bishengir-compile"}.get(name),
                dev_glob=str(dev / "davinci[0-9]*"), cann_roots=[str(tmp_path / "Ascend")])


def _by_name(findings: list[Finding]) -> dict[str, Finding]:
    return {f.name: f for f in findings}


def test_complete_fake_install_is_available(tmp_path):
    # the fake torch_npu and triton packages raise on import: passing proves the probe never imports them
    findings = check_environment(**_fake_install(tmp_path))
    assert all(f.ok for f in findings), summarize(findings)
    assert summarize(findings).startswith("Ascend environment complete") and "triton-ascend 3.2.0" in summarize(findings)


def test_torch_npu_for_another_torch_is_reported_with_the_matching_install(tmp_path):
    f = _by_name(check_environment(**_fake_install(tmp_path, torch_pin="2.12.0")))["torch_npu"]
    assert not f.ok
    assert "requires torch 2.12.0 but torch 2.13.0+cpu is installed" in f.what
    assert "pip install torch-npu==2.13.0" in f.fix


def test_a_cuda_build_of_torch_is_reported(tmp_path):
    kw = _fake_install(tmp_path)
    kw.update(torch_version="2.13.0+cu128", torch_cuda="12.8")
    f = _by_name(check_environment(**kw))["torch"]
    assert not f.ok and "Two accelerators" in f.what and "whl/cpu" in f.fix


@pytest.mark.parametrize("triton,expect", [
    ("upstream", "upstream triton 3.6.0 is installed; Ascend needs triton-ascend"),
    ("both", "both triton-ascend 3.2.0 and upstream triton 3.6.0 are installed"),
])
def test_upstream_triton_is_reported(tmp_path, triton, expect):
    f = _by_name(check_environment(**_fake_install(tmp_path, triton=triton)))["triton"]
    assert not f.ok and expect in f.what and "pip install triton-ascend" in f.fix


def test_cann_not_sourced_points_at_the_set_env_sh_it_found(tmp_path):
    kw = _fake_install(tmp_path)
    kw["env"] = {}
    found = _by_name(check_environment(**kw))
    sh = str(tmp_path / "Ascend" / "ascend-toolkit" / "set_env.sh")
    assert not found["CANN"].ok and "ASCEND_HOME_PATH and ASCEND_TOOLKIT_HOME are unset" in found["CANN"].what
    assert found["CANN"].fix == f"source {sh}"
    assert not found["libhccl.so"].ok and not found["libascendcl.so"].ok


def test_library_present_but_not_on_ld_library_path(tmp_path):
    kw = _fake_install(tmp_path)
    kw["env"] = {k: v for k, v in kw["env"].items() if k != "LD_LIBRARY_PATH"}
    f = _by_name(check_environment(**kw))["libhccl.so"]
    # a warning, not a failure (issue 20): containers load CANN without LD_LIBRARY_PATH (when find_library,
    # i.e. the loader cache of this machine, does not know it either)
    assert f.ok and f.warning and "not on LD_LIBRARY_PATH" in f.what.replace("neither on", "not on") \
        and f.fix.startswith("source ")


def test_driver_and_device_nodes(tmp_path):
    kw = _fake_install(tmp_path)
    kw["which"] = lambda name: None
    kw["env"] = dict(kw["env"], ASCEND_RT_VISIBLE_DEVICES="")
    found = _by_name(check_environment(**kw))
    # npu-smi is only a warning while device nodes exist (containers often lack it; torch_npu does not need it)
    assert found["npu-smi"].ok and found["npu-smi"].warning and "driver" in found["npu-smi"].fix
    assert not found["devices"].ok and "ASCEND_RT_VISIBLE_DEVICES" in found["devices"].what
    kw["dev_glob"] = str(tmp_path / "nodev" / "davinci[0-9]*")
    found = _by_name(check_environment(**kw))
    assert not found["npu-smi"].ok and not found["devices"].ok


def test_set_env_candidates_cover_toolkit_and_cann_layouts():
    c = set_env_candidates({"ASCEND_HOME_PATH": "/opt/x/ascend-toolkit/latest"}, roots=["/usr/local/Ascend"])
    assert c[:2] == ["/opt/x/ascend-toolkit/latest/set_env.sh", "/opt/x/ascend-toolkit/set_env.sh"]
    assert "/usr/local/Ascend/cann/set_env.sh" in c and "/usr/local/Ascend/ascend-toolkit/set_env.sh" in c


def test_torch_release_strips_the_local_build():
    assert torch_release("2.13.0+cpu") == "2.13.0" and torch_release("2.8.0") == "2.8.0"


def test_this_machine_lacks_every_piece():
    import torch

    found = _by_name(check_environment())
    rel = torch_release(torch.__version__)
    assert not found["torch_npu"].ok and f"pip install torch-npu=={rel}" in found["torch_npu"].fix
    assert not found["triton"].ok and "triton-ascend" in found["triton"].fix
    assert not found["CANN"].ok and "set_env.sh" in found["CANN"].fix


def test_probe_in_interpreter_mode_needs_triton_interpret(monkeypatch):
    from agoq_ascend.plugin import probe

    monkeypatch.setenv("AGOQ_ASCEND_INTERPRET", "1")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    av = probe()
    assert not av.ok and "needs TRITON_INTERPRET=1" in av.reason
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert probe().ok


def test_agoq_backend_ascend_fails_here_with_what_is_missing_and_the_fix():
    """A fresh process, as a user would run it: the message names torch_npu for this torch release, CANN's
    set_env.sh, triton-ascend instead of triton, and the install guide; torch_npu/triton are not imported."""
    import torch

    rel = torch_release(torch.__version__)
    code = textwrap.dedent("""
        import sys, torch, agoq_core
        try:
            agoq_core.quantize(torch.ones(8), "int4")
        except Exception as exc:
            print(type(exc).__name__)
            print(exc)
        print("IMPORTED:", [m for m in sys.modules if m.split('.')[0] in ('torch_npu', 'triton')])
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGOQ_")}
    env["AGOQ_BACKEND"] = "ascend"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120).stdout
    assert out.startswith("BackendUnavailableError"), out
    for needle in (f"pip install torch-npu=={rel}", f"matches torch {rel}", "set_env.sh",
                   "upstream triton", "pip install triton-ascend", "docs/backends/ascend.md",
                   "AGOQ_ASCEND_INTERPRET=1 TRITON_INTERPRET=1"):
        assert needle in out, f"{needle!r} missing from:\n{out}"
    assert "IMPORTED: []" in out


# ---- SoC classification -----------------------------------------------------------------------------------
@pytest.mark.parametrize("ver,name,family,fp8,ub", [
    (223, "Ascend910B3", "A2", False, 192 * 1024),
    (220, "Ascend910B1", "A2", False, 192 * 1024),
    (251, "Ascend910_9392", "A3", False, 192 * 1024),
    (260, "Ascend950PR", "950", True, 256 * 1024),
    (-1, "Ascend910B4", "A2", False, 192 * 1024),      # unknown integer: the name decides
    (-1, "Ascend950DT", "950", True, 256 * 1024),
])
def test_soc_classification(ver, name, family, fp8, ub):
    s = classify(ver, name)
    assert (s.family, s.fp8_native, s.ub_bytes) == (family, fp8, ub)


@pytest.mark.parametrize("ver,name", [(202, "Ascend310P3"), (102, "Ascend910A"), (-1, "")])
def test_unsupported_soc_is_an_error(ver, name):
    with pytest.raises(UnsupportedSocError, match="Atlas A2 .* Atlas A3 .* Ascend 950"):
        classify(ver, name)


def test_interpreter_mode_is_never_auto_selected(monkeypatch):
    """Like agoq-cuda's interpreter mode: CPU tensors, not an accelerator, used only when named."""
    from agoq_core.backend import manager
    from agoq_ascend.plugin import agoq_backends

    monkeypatch.setenv("AGOQ_ASCEND_INTERPRET", "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    (info,) = agoq_backends()
    assert (info.device_type, info.accelerator) == ("cpu", False)
    monkeypatch.delenv("AGOQ_ASCEND_INTERPRET")
    (info,) = agoq_backends()
    assert (info.device_type, info.accelerator) == ("npu", True)
    manager.reset()


# ---- issue 20, item 7: compiler, CANN version and compatibility, containers without LD_LIBRARY_PATH / npu-smi ----
def test_bishengir_compile_is_required_and_located(tmp_path):
    inst = _fake_install(tmp_path)
    home = Path(inst["env"]["ASCEND_HOME_PATH"])
    (home / "compiler" / "bishengir" / "bin").mkdir(parents=True)
    (home / "compiler" / "bishengir" / "bin" / "bishengir-compile").write_text("")
    inst["which"] = lambda name: "/usr/local/sbin/npu-smi" if name == "npu-smi" else None
    f = _by_name(check_environment(**inst))["bishengir-compile"]
    assert not f.ok and "not on PATH" in f.what and f.fix == f"export PATH={home}/compiler/bishengir/bin:$PATH"


def test_cann_version_is_reported_and_unpublished_combinations_warn(tmp_path):
    inst = _fake_install(tmp_path)
    found = _by_name(check_environment(**inst))
    assert found["CANN version"].what == "CANN 8.5.0" and "compatibility" not in found  # 3.2.0 <-> 8.5.0: published
    (Path(inst["env"]["ASCEND_HOME_PATH"]) / "version.info").write_text("Version=8.3.RC1\n")
    findings = check_environment(**inst)
    w = _by_name(findings)["compatibility"]
    assert w.ok and w.warning and "triton-ascend 3.2.0 is published for CANN 8.5.0, this is CANN 8.3.RC1" in w.what
    assert summarize(findings).startswith("Ascend environment complete") and "warning: compatibility" in summarize(findings)


def test_container_without_ld_library_path_or_npu_smi_is_available(tmp_path, monkeypatch):
    from agoq_ascend import environment as E

    inst = _fake_install(tmp_path)
    inst["env"].pop("LD_LIBRARY_PATH")
    inst["which"] = lambda name: "/opt/bishengir-compile" if name == "bishengir-compile" else None  # no npu-smi
    monkeypatch.setattr(E, "find_library", lambda name: f"/usr/local/Ascend/lib64/lib{name}.so")  # loader cache
    findings = check_environment(**inst)
    assert all(f.ok for f in findings), summarize(findings)
    f = _by_name(findings)
    assert "loader's cache" in f["libhccl.so"].what and f["npu-smi"].warning
    monkeypatch.setattr(E, "find_library", lambda name: None)  # only under the CANN home: a warning, not a failure
    f = _by_name(check_environment(**inst))
    assert f["libhccl.so"].ok and f["libhccl.so"].warning and "neither on LD_LIBRARY_PATH" in f["libhccl.so"].what
