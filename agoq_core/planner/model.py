"""Model shapes for the planner, and how a model's layers are split over virtual stages.

The shapes are agoq's one registry, :mod:`agoq_core.models` (``TransformerShape`` is its
``ModelShape``, ``MODEL_PRESETS`` its ``MODELS``): a preset name, a Hugging Face config (``LlamaConfig``
and friends) or model, or a shape. ``model_shape`` is the registry's lookup with planner errors.

Layer split: ``layers`` decoder layers over ``V = stages * chunks`` virtual stages, ``layers // V``
each, and the last ``layers % V`` virtual stages one more (virtual stage 0 also holds the
embedding, the last one the final norm and LM head; torchtitan splits the same way). Virtual stage
``k`` runs on rank ``k % stages`` (torch's interleaved mapping).
"""
from __future__ import annotations

from agoq_core.models import MODELS, ModelShape, ModelShapeError, get_model_shape
from agoq_core.planner.errors import PlannerError
from agoq_core.planner.schedules import PipelineSpec

__all__ = ["TransformerShape", "MODEL_PRESETS", "model_shape", "split_layers", "stage_params"]

#: The planner's historical names for the registry's ModelShape and MODELS (same objects).
TransformerShape = ModelShape
MODEL_PRESETS = MODELS


def model_shape(model: object) -> ModelShape:
    """A ModelShape from a preset name, a ModelShape, or an HF config / model (PlannerError if not)."""
    try:
        return get_model_shape(model)
    except ModelShapeError as exc:
        raise PlannerError(str(exc)) from None


def split_layers(num_layers: int, spec: PipelineSpec) -> tuple[tuple[int, ...], ...]:
    """Global decoder-layer indices of each virtual stage (index = virtual stage)."""
    V = spec.virtual_stages
    if num_layers < V:
        raise PlannerError(
            f"{num_layers} decoder layers cannot fill {spec.stages} stages x {spec.chunks} chunks = {V} virtual "
            f"stages; use at most {num_layers} virtual stages (fewer stages or chunks)")
    base, extra = divmod(num_layers, V)
    out, start = [], 0
    for k in range(V):
        n = base + (1 if k >= V - extra else 0)
        out.append(tuple(range(start, start + n)))
        start += n
    return tuple(out)


def stage_params(shape: ModelShape, spec: PipelineSpec, rank: int,
                 layers: tuple[tuple[int, ...], ...] | None = None) -> int:
    """Parameters pipeline rank ``rank`` holds (all its virtual stages): its decoder layers, the
    embedding on virtual stage 0, the final norm and LM head on the last (``layers``: the split,
    default :func:`split_layers`)."""
    layers = layers if layers is not None else split_layers(shape.layers, spec)
    n = 0
    for vs in spec.vstages_of(rank):
        n += len(layers[vs]) * shape.layer_params
        if vs == 0:
            n += shape.embed_params
        if vs == spec.virtual_stages - 1:
            n += shape.head_params
    return n
