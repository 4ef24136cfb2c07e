"""Bad arguments to `agoq plan` and `agoq memory` are usage errors (exit 2) with a message naming the
rule, never a traceback and never silently replaced by preset values (issue 15 §9)."""
from __future__ import annotations

import pytest

from agoq_core.cli.main import main


def _run(capsys, *argv):
    try:
        rc = main(list(argv))
    except SystemExit as exc:  # argparse's usage errors
        rc = exc.code
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return rc, out.err


@pytest.mark.parametrize("argv, needle", [
    (("plan", "--budget-bytes", "1e999"), "cannot read '1e999' as bytes (a finite number"),
    (("plan", "--activation-budget-bytes", "inf"), "cannot read 'inf' as bytes"),
    (("plan", "--run-check", "-1"), "argument --run-check: must be >= 0, got -1"),
    (("plan", "--stages", "0"), "argument --stages: must be >= 1, got 0"),
    (("memory", "--layers", "0"), "ModelShape.layers must be an int >= 1, got 0"),
    (("memory", "--heads", "0"), "ModelShape.heads must be an int >= 1, got 0"),
    (("memory", "--kv-heads", "3"), "heads (4) must be a multiple of kv_heads (3)"),
    (("memory", "--hidden", "30", "--heads", "4"), "hidden (30) must be a multiple of heads (4)"),
    (("memory", "--hidden", "36", "--heads", "4"), "head_dim = hidden (36) / heads (4) = 9 is odd"),
    (("memory", "--device", "bogus"), "--device 'bogus' is not a torch device"),
    (("memory", "--seq", "0"), "argument --seq: must be >= 1, got 0"),
])
def test_bad_arguments_exit_2_with_the_rule(capsys, argv, needle):
    rc, err = _run(capsys, *argv)
    assert rc == 2, err
    assert needle in err, err


def test_memory_uses_explicit_shape_flags(capsys):
    """--layers 1 is honoured (the preset has 2): flags override presets, zero is refused, never replaced."""
    import json

    rc = main(["memory", "--layers", "1", "--heads", "2", "--kv-heads", "1", "--hidden", "64",
               "--intermediate", "96", "--vocab", "64", "--seq", "8", "--json"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["plain"]["per_layer"]) == 1
