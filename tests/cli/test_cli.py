"""The `agoq` command as users run it (subprocess, real entry points)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def agoq(*args, env=None, check=True):
    e = {k: v for k, v in os.environ.items() if k != "AGOQ_BACKEND"}
    e.update(env or {})
    out = subprocess.run([sys.executable, "-m", "agoq_core.cli.main", *args], capture_output=True, text=True,
                         env=e, timeout=600)
    if check and out.returncode != 0:
        raise AssertionError(f"agoq {' '.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out


def _auto_backend() -> str:
    """Without an accelerator the cpu plugin is chosen where installed (scripts/setup.sh does), else reference."""
    from importlib.metadata import entry_points

    return "cpu" if any(ep.name == "cpu" for ep in entry_points(group="agoq.backends")) else "reference"


def test_backends_shows_the_auto_selected_backend_with_reason():
    name = _auto_backend()
    out = agoq("backends").stdout
    assert f"*{name}" in out
    assert f"selected: {name} (auto: no accelerator backend is available" in out
    data = json.loads(agoq("backends", "--json").stdout)
    assert data["selected"]["name"] == name
    out = agoq("backends", env={"AGOQ_BACKEND": "reference"}).stdout
    assert "*reference" in out and "selected: reference" in out


def test_unknown_backend_fails_and_lists_installed():
    out = agoq("backends", env={"AGOQ_BACKEND": "nope"}, check=False)
    assert out.returncode == 2
    assert "AGOQ_BACKEND='nope' is not an installed backend" in out.stderr
    assert "reference (from agoq)" in out.stderr


def test_formats_table_and_json():
    data = json.loads(agoq("formats", "--json", "--numel", "8192").stdout)
    rows = {r["format"]: r for r in data["formats"]}
    assert rows["int4"]["bits_per_element"] == 4.25
    assert rows["int8"]["sqnr_gauss_db"] > rows["int6"]["sqnr_gauss_db"] > rows["int5"]["sqnr_gauss_db"] > rows["int4"]["sqnr_gauss_db"]
    assert "SQNR" in agoq("formats", "--numel", "4096").stdout


def test_conformance_run_and_compare_catches_one_changed_case(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    out = agoq("conformance", "run", "--backend", "reference", "--report", str(a), "-q")
    # 765 golden cases (spec version 3) + 216 decode cases of the kept v2 set + 2 capability cases (issue 20)
    assert "pass=983" in out.stdout
    agoq("conformance", "run", "--backend", "reference", "--report", str(b), "-q", "--select", "*")
    assert agoq("conformance", "compare", str(a), str(b)).returncode == 0
    rep = json.loads(b.read_text())
    victim = rep["cases"][123]
    victim["output_sha256"] = "0" * 64
    b.write_text(json.dumps(rep))
    res = agoq("conformance", "compare", str(a), str(b), check=False)
    assert res.returncode == 1
    assert victim["id"] in res.stderr and "1 case(s) differ" in res.stderr


def test_help_lists_subcommands():
    out = agoq("--help").stdout
    for cmd in ("backends", "formats", "conformance"):
        assert cmd in out


def test_version_and_typed_marker(capsys):
    import pathlib

    import agoq_core
    from agoq_core.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"agoq {agoq_core.__version__}"
    assert (pathlib.Path(agoq_core.__file__).parent / "py.typed").is_file()  # pyproject ships it


def test_memory_uses_the_registry_and_rejects_bad_sizes(capsys):
    from agoq_core.cli.main import main
    from agoq_core.models import MODELS

    assert main(["memory", "--preset", "tiny", "--layers", "1", "--seq", "16", "--dtype", "fp32", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["preset"] == "tiny" and set(d["plain"]["per_layer"]) == {"0"}
    for argv, needle in ((["--layers", "0"], "ModelShape.layers must be an int >= 1, got 0"),
                         (["--kv-heads", "3"], "heads (4) must be a multiple of kv_heads (3)")):
        assert main(["memory", *argv]) == 2
        assert needle in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: the presets are the registry's names
        main(["memory", "--preset", "gpt5"])
    assert "llama2-13b" in capsys.readouterr().err and "llama2-13b" in MODELS
