"""The model registry (agoq_core.models): one definition per name, HF configs both ways, clear errors."""
from __future__ import annotations

import pytest

from agoq_core.models import MODELS, ModelShape, ModelShapeError, get_model_shape

transformers = pytest.importorskip("transformers")


def test_one_definition_per_name_and_the_old_names_are_the_same_objects():
    from agoq_core.planner import model as planner_model
    from agoq_core.train.models import MODEL_SIZES

    assert planner_model.MODEL_PRESETS is MODELS and MODEL_SIZES is MODELS
    assert planner_model.TransformerShape is ModelShape
    assert all(s.name == n for n, s in MODELS.items())
    # the sizes the rest of the project (and the real checkpoints) rely on
    assert (MODELS["tiny"].layers, MODELS["tiny"].hidden, MODELS["tiny"].vocab) == (4, 256, 4096)
    assert MODELS["tiny-8l"].layers == 8 and MODELS["llama-1b"].vocab == 128256
    assert MODELS["llama-1b"].tie_embeddings and MODELS["llama-1b"].rope_theta == 500000.0
    assert (MODELS["llama2-7b"].intermediate, MODELS["llama2-7b"].vocab) == (11008, 32000)


def test_hf_config_written_by_hand_matches():
    # what agoq train has always built, written out independently of the registry
    shape = MODELS["llama-1b"]
    want = transformers.LlamaConfig(
        vocab_size=4096, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=128, rope_theta=500000.0, tie_word_embeddings=True,
        rms_norm_eps=1e-5, attention_dropout=0.0, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        use_cache=False)
    got = shape.to_hf_config(vocab_size=4096, max_position_embeddings=128)
    assert got.to_dict() == want.to_dict() and got._attn_implementation == "sdpa"
    assert type(shape.to_hf_config("qwen2")).__name__ == "Qwen2Config"


@pytest.mark.parametrize("name", list(MODELS))
def test_hf_config_round_trip(name):
    s = MODELS[name]
    back = get_model_shape(s.to_hf_config())
    assert back.replace(name=s.name, note=s.note) == s
    model_like = type("M", (), {"config": s.to_hf_config()})()  # an HF model carries its config
    assert get_model_shape(model_like).hidden == s.hidden


def test_bad_input_names_the_fix():
    with pytest.raises(ModelShapeError, match="unknown model 'gpt5'; presets: tiny, tiny-8l"):
        get_model_shape("gpt5")
    with pytest.raises(ModelShapeError, match=r"it lacks \['hidden_size'"):
        get_model_shape(object())
    with pytest.raises(ModelShapeError, match=r"hidden \(30\) must be a multiple of heads \(4\)"):
        MODELS["tiny"].replace(hidden=30)
    with pytest.raises(ModelShapeError, match=r"heads \(4\) must be a multiple of kv_heads \(3\)"):
        MODELS["tiny"].replace(kv_heads=3)
    with pytest.raises(ModelShapeError, match="layers must be an int >= 1, got 0"):
        MODELS["tiny"].replace(layers=0)
    with pytest.raises(ModelShapeError, match="unknown model family 'gpt99'"):
        MODELS["tiny"].to_hf_config("gpt99")
    from agoq_core.planner import PlannerError
    from agoq_core.planner.model import model_shape

    with pytest.raises(PlannerError, match="unknown model 'gpt5'"):  # the planner keeps its error type
        model_shape("gpt5")
