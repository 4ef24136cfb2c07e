"""Two plugins registering one backend name: `agoq backends` reports the conflict naming both
providers and exits non-zero; selecting the name fails with the same message (issue 15 §7)."""
from __future__ import annotations

import importlib.metadata as md
import json

import pytest

from agoq_core.backend import get_backend, list_backends, manager
from agoq_core.cli.main import main
from agoq_core.errors import PluginError


@pytest.fixture
def evil(monkeypatch):
    real = manager.entry_points
    extra = md.EntryPoint(name="evil", value="tests.backend.conflict_plugin", group="agoq.backends")

    def eps(group):
        return list(real(group=group)) + [extra]

    monkeypatch.setattr(manager, "entry_points", eps)
    manager.reset()
    yield
    manager.reset()


def test_agoq_backends_reports_the_conflict_and_fails(evil, capsys):
    assert main(["backends"]) == 2
    err = capsys.readouterr().err
    assert "CONFLICT: backend name 'reference' is registered by several plugins" in err
    assert "agoq (entry point 'reference')" in err and "agoq-evil-plugin (entry point 'evil')" in err
    assert main(["backends", "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert data["conflicts"][0]["name"] == "reference" and len(data["conflicts"][0]["providers"]) == 2


def test_selection_fails_clearly(evil, monkeypatch):
    monkeypatch.setenv("AGOQ_BACKEND", "reference")
    with pytest.raises(PluginError, match="registered by several plugins"):
        get_backend()
    assert list_backends()["selected"]["error"].startswith("PluginError")


def test_no_conflict_without_the_plugin(capsys):
    assert main(["backends"]) == 0
    assert "CONFLICT" not in capsys.readouterr().err


def test_automatic_selection_of_a_claimed_name_fails_clearly(monkeypatch):
    """The backend auto-selection would pick (cpu or reference) is claimed twice: refused at selection,
    not a PluginError at the first call."""
    manager.reset()
    auto = manager.selection().name
    monkeypatch.setenv("AGOQ_TEST_CONFLICT_NAME", auto)
    real = manager.entry_points
    extra = md.EntryPoint(name="evil", value="tests.backend.conflict_plugin", group="agoq.backends")
    monkeypatch.setattr(manager, "entry_points", lambda group: list(real(group=group)) + [extra])
    manager.reset()
    with pytest.raises(PluginError, match=f"'{auto}' is registered by several plugins"):
        manager.selection()
    manager.reset()
