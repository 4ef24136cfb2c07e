"""TrainConfig: defaults, config files (JSON/TOML/YAML), flags over files, and clear errors."""
from __future__ import annotations

import argparse
import json

import pytest

from agoq_core.cli.train_cmd import register, resolve
from agoq_core.train.config import ABLATIONS, ConfigError, TrainConfig, config_from_dict, load_config_file


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    register(p)
    return p.parse_args(argv)


def test_defaults_are_valid_and_derived_values_follow():
    cfg = TrainConfig()
    assert cfg.model == "tiny" and cfg.arms == ("baseline", "agoq")
    assert cfg.warmup_steps == cfg.steps // 10
    assert cfg.tokens_per_step == cfg.seq_len * cfg.micro_batch * cfg.grad_accum * cfg.dp
    c2 = TrainConfig(nproc=4, grad_accum=3, micro_batch=4, seq_len=16)
    assert c2.dp == 4 and c2.tokens_per_step == 16 * 4 * 3 * 4
    c3 = TrainConfig(nproc=2, pp=2, micro_batch=8)
    assert c3.dp == 1 and c3.num_pp_microbatches == 4 and c3.tokens_per_step == 128 * 8


@pytest.mark.parametrize("suffix,text", [
    (".json", json.dumps({"model": "small", "steps": 7, "lr": 0.0005, "ablations": ["uniform4-attn"]})),
    (".toml", 'model = "small"\nsteps = 7\nlr = 5e-4\nablations = ["uniform4-attn"]\n'),
    (".toml", '[train]\nmodel = "small"\nsteps = 7\nlr = 5e-4\nablations = ["uniform4-attn"]\n'),
    # PyYAML reads 5e-4 (no dot) as a string: it must still become a float
    (".yaml", "model: small\nsteps: 7\nlr: 5e-4\nablations: uniform4-attn\n"),
])
def test_config_files(tmp_path, suffix, text):
    f = tmp_path / f"run{suffix}"
    f.write_text(text)
    cfg = config_from_dict(load_config_file(f))
    assert (cfg.model, cfg.steps, cfg.lr, cfg.ablations) == ("small", 7, 5e-4, ("uniform4-attn",))


def test_flags_override_the_config_file(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"steps": 7, "seq_len": 64, "lr": 1e-3}))
    cfg = resolve(_parse(["--config", str(f), "--steps", "9", "--ablation", "naive-fp8-allreduce,int8-everywhere"]))
    assert cfg.steps == 9            # flag wins
    assert cfg.seq_len == 64         # file wins over the default
    assert cfg.lr == 1e-3
    assert cfg.ablations == ("naive-fp8-allreduce", "int8-everywhere")
    assert cfg.warmup_steps == 0     # 10% of the final steps, not of the file's
    assert resolve(_parse([])) == TrainConfig()


@pytest.mark.parametrize("values,needle", [
    ({"model": "huge"}, "unknown model size 'huge'; choose one of ['llama-1b', 'llama2-13b', 'llama2-7b', "
                        "'llama3-8b', 'micro', 'small', 'tiny', 'tiny-8l']"),
    ({"nproc": 0}, "nproc must be a positive integer, got 0"),
    ({"nproc": -2}, "nproc must be a positive integer"),
    ({"nproc": 2.0}, "nproc must be a positive integer"),
    ({"nproc": 3, "pp": 2}, "nproc (3) must be a multiple of pp (2)"),
    ({"nproc": 4, "pp": 2}, "would mean 2 data-parallel pipeline replicas"),
    ({"nproc": 2, "pp": 2, "pp_schedule": "zb"}, "pp_schedule must be gpipe, 1f1b or interleaved-1f1b"),
    ({"ablations": ["uniform4"]}, "unknown ablation 'uniform4'; choose from"),
    ({"ablations": ["uniform4-attn", "uniform4-attn"]}, "ablation listed twice"),
    ({"steps": 10, "warmup_steps": 10}, "warmup_steps (10) must be smaller than steps (10)"),
    ({"lr": "fast"}, "lr must be a number, got 'fast'"),
    ({"lr": -1.0}, "lr must be a positive number"),
    ({"dtype": "fp8"}, "dtype must be 'auto', 'fp32' or 'bf16'"),
    ({"agoq_optimizer": "lion"}, "agoq_optimizer must be 'adamw' or 'adamw8bit'"),
    ({"baseline": False, "agoq": False}, "nothing to train"),
    ({"baseline": "yes"}, "baseline must be true or false"),
    ({"stepz": 3}, "unknown option 'stepz' (did you mean 'steps'?)"),
    ({"pp": 2, "nproc": 2, "micro_batch": 6, "pp_microbatches": 4}, "micro_batch (6) must divide into"),
])
def test_bad_values_name_the_problem(values, needle):
    with pytest.raises(ConfigError) as exc:
        config_from_dict(values)
    assert needle in str(exc.value)


def test_bad_config_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config_file(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{steps: 3")
    with pytest.raises(ConfigError, match="could not be parsed"):
        load_config_file(bad)
    ini = tmp_path / "x.ini"
    ini.write_text("steps=3")
    with pytest.raises(ConfigError, match="unknown extension '.ini'"):
        load_config_file(ini)
    lst = tmp_path / "l.json"
    lst.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config_file(lst)


def test_every_ablation_has_a_recipe():
    from agoq_core.train.recipes import RECIPES

    assert set(ABLATIONS) | {"baseline", "agoq"} == set(RECIPES)


def test_derived_warmup_follows_the_merged_steps(tmp_path):
    # issue 15: warm-up is 10% of the final step count, whichever source set it
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"model": "tiny"}))
    assert resolve(_parse(["--config", str(f), "--steps", "1000"])).warmup_steps == 100
    cfg = resolve(_parse(["--config", str(f), "--steps", "5"]))
    assert (cfg.steps, cfg.warmup_steps) == (5, 0)
    # an explicit warm-up (file or flag) is kept; replace() re-derives only a derived one
    f.write_text(json.dumps({"model": "tiny", "warmup_steps": 7}))
    assert resolve(_parse(["--config", str(f), "--steps", "1000"])).warmup_steps == 7
    assert TrainConfig(steps=50).replace(steps=1000).warmup_steps == 100
    assert TrainConfig(steps=50, warmup_steps=3).replace(steps=1000).warmup_steps == 3


def test_flags_are_generated_from_the_config_fields():
    # every TrainConfig field but the baseline's fixed optimizer has a flag, named after the field
    p = argparse.ArgumentParser()
    register(p)
    dests = {a.dest: a for a in p._actions}
    import dataclasses

    for f in dataclasses.fields(TrainConfig):
        if f.name == "optimizer":
            assert f.name not in dests
            continue
        a = dests[f.name]
        assert a.help and a.default == argparse.SUPPRESS
    assert dests["plot"].option_strings == ["--no-plot"] and dests["ablations"].option_strings == ["--ablation"]
    assert dests["seq_len"].option_strings == ["--seq-len"] and dests["seq_len"].type is int
    assert dests["lr"].type is float and dests["warmup_steps"].type is int
