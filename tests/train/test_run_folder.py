"""`agoq train`'s run folder and options under hostile conditions (issue 15 §1, §2, §9): runs started
in the same second, names escaping --out-dir, SIGINT/SIGTERM, unwritable folders, derived defaults
after every source is merged, non-finite or unreadable inputs."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from agoq_core.cli.main import main
from agoq_core.train import rundir
from agoq_core.train.config import ConfigError, TrainConfig

SMALL = ["--seq-len", "32", "--eval-tokens", "128", "--no-progress", "--no-plot", "--micro-batch", "2"]


# ---- §1: exclusive, atomic run folders -----------------------------------------------------------------

def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    class Frozen:  # every run asks for the same timestamp
        class datetime:
            @staticmethod
            def now():
                import datetime as real

                return real.datetime(2026, 12, 1, 5, 0, 0)

    monkeypatch.setattr(rundir, "_dt", Frozen)
    barrier = threading.Barrier(12)
    made: list = []

    def start():
        barrier.wait()
        made.append(rundir.create_run_dir(tmp_path))

    threads = [threading.Thread(target=start) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({str(p) for p in made}) == 12  # never shared
    assert sorted(p.name for p in made) == sorted(["20261201-050000"] + [f"20261201-050000-{i}" for i in range(2, 13)])
    assert all(rundir.read_status(p)["status"] == "running" for p in made)


def test_named_folder_is_exclusive_even_when_empty(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(rundir.RunDirError, match="already exists; pick another --run-name"):
        rundir.create_run_dir(tmp_path, "x")  # empty but taken: a concurrent run may be starting in it


@pytest.mark.parametrize("name", ["../x", "..", ".", "a/b", "/tmp/abs", "a\\b"])
def test_run_name_cannot_escape_out_dir(tmp_path, capsys, name):
    with pytest.raises(ConfigError, match="must be a single folder name inside --out-dir"):
        TrainConfig(run_name=name)
    assert main(["train", "--out-dir", str(tmp_path / "runs"), "--run-name", name, "--steps", "1"]) == 2
    assert "single folder name inside --out-dir" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "runs").exists()


def test_completed_run_has_status_and_only_final_files(tmp_path, capsys):
    assert main(["train", *SMALL, "--steps", "2", "--no-agoq", "--out-dir", str(tmp_path), "--run-name", "ok"]) == 0
    d = tmp_path / "ok"
    assert rundir.read_status(d)["status"] == "completed"
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "metrics.jsonl", "status.json", "summary.json",
                                                   "table.md"]  # no temporaries, no .partial
    assert all(json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines())


def test_unwritable_out_dir_is_a_clear_error(capsys):
    assert main(["train", "--out-dir", "/proc/agoq-runs", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "cannot create --out-dir '/proc/agoq-runs'" in err and "choose a writable --out-dir" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_leaves_an_interrupted_status(tmp_path, capsys, sig, code):
    d = tmp_path / "sig"
    partial = d / "metrics.jsonl.partial"
    before = signal.getsignal(sig)

    def fire():  # as soon as the first step is recorded, signal this process
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if partial.is_file() and partial.stat().st_size > 0:
                os.kill(os.getpid(), sig)
                return
            time.sleep(0.05)

    t = threading.Thread(target=fire, daemon=True)
    t.start()
    rc = main(["train", *SMALL, "--steps", "500", "--eval-every", "0", "--no-agoq", "--out-dir", str(tmp_path),
               "--run-name", "sig"])
    t.join(5)
    assert rc == code
    st = rundir.read_status(d)
    assert st["status"] == "interrupted" and st["signal"] == sig.name
    assert "says 'interrupted'" in capsys.readouterr().err
    lines = partial.read_text().splitlines()
    assert lines and json.loads(lines[0])["kind"] == "step"  # finished steps are kept
    assert not (d / "summary.json").exists() and not (d / "metrics.jsonl").exists()
    assert signal.getsignal(sig) == before  # the run's handlers are removed again


# ---- §2: derived defaults after every source -------------------------------------------------------------

@pytest.mark.parametrize("steps, warmup", [("1000", 100), ("5", 0)])
def test_warmup_follows_the_final_steps(tmp_path, capsys, steps, warmup):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"model": "tiny"}))
    assert main(["train", "--config", str(f), "--steps", steps, "--print-config"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    assert (cfg["steps"], cfg["warmup_steps"]) == (int(steps), warmup)


def test_explicit_warmup_is_kept_and_replace_rederives():
    f_cfg = TrainConfig(steps=1000, warmup_steps=7)
    assert f_cfg.replace(steps=50).warmup_steps == 7
    assert TrainConfig(steps=1000).replace(steps=50).warmup_steps == 5


# ---- §9: bad values and files ------------------------------------------------------------------------------

@pytest.mark.parametrize("flag, value", [("--lr", "inf"), ("--lr", "nan"), ("--grad-clip", "inf"),
                                         ("--weight-decay", "nan"), ("--min-lr-ratio", "nan")])
def test_non_finite_numbers_are_refused(capsys, flag, value):
    assert main(["train", flag, value, "--print-config"]) == 2
    field = flag[2:].replace("-", "_")
    assert f"{field} must be a finite number, got {value}" in capsys.readouterr().err


@pytest.mark.parametrize("kind, needle", [("latin1", "is not UTF-8 text (byte 0xe9 at offset 12)"),
                                          ("unreadable", "cannot be read"), ("directory", "is a directory")])
def test_bad_config_files_are_clear_errors(tmp_path, capsys, kind, needle):
    if kind == "latin1":
        path = tmp_path / "c.json"
        path.write_bytes('{"model": "t\u00e9ny"}'.encode("latin-1"))
    elif kind == "unreadable":
        path = tmp_path / "c.json"
        path.write_text("{}")
        path.chmod(0)
        if os.access(path, os.R_OK):  # root reads anything; /proc/self/mem refuses a plain read
            path = "/proc/self/mem"
    else:
        path = tmp_path
    assert main(["train", "--config", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
