"""LAAQ under torch.compile.

* Training: while compiling, converted norms, linears and SwiGLU MLPs run LAAQ's traceable path
  (agoq_core.laaq.traced: codecs as ``agoq::`` custom ops, state through module state): a compiled
  decoder layer has no graph break, ``fullgraph=True`` compiles forward and backward, the kept bits
  are eager LAAQ's, and gradients equal eager LAAQ's (bit for bit with ``aot_eager``; within fp32
  rounding, 1e-5, with Inductor, which reorders sums and fuses the code around LAAQ).
* Inference (autograd off): LAAQ is invisible to the compiler -- the converted forwards run the
  modules' own forwards, so ``fullgraph=True`` compiles.
* Where the traced path does not apply (PEFT LoRA wrappers, the attention-core ablation) the eager
  LAAQ path runs behind ``torch.compiler.disable``: graph breaks, same numerics.
"""
from __future__ import annotations

import pytest
import torch

from agoq_core.laaq import LAAQConfig, apply, remove
from tests.laaq.conftest import grads, rel_err, small_batch, small_model


def test_inference_compiles_fullgraph_with_laaq_applied():
    torch._dynamo.reset()
    model = small_model("llama")
    ids = small_batch()
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    apply(model)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with torch.no_grad():
        out = compiled(input_ids=ids).logits
    assert torch.equal(out, ref)
    remove(model)
    torch._dynamo.reset()


def _layer_step(model, seq: int = 32):
    layer = model.model.layers[0]
    x = torch.randn(2, seq, model.config.hidden_size, requires_grad=True)
    pos = model.model.rotary_emb(x, torch.arange(seq)[None].expand(2, -1))

    def step(x):
        return layer(x, position_embeddings=pos, attention_mask=None).square().sum()

    return layer, x, step


def _grads(module, x):
    out = {n: p.grad.clone() for n, p in module.named_parameters()}
    out["input"] = x.grad.clone()
    module.zero_grad(set_to_none=True)
    x.grad = None
    return out


@pytest.mark.parametrize("backend", [None, "reference"])  # None: the auto-selected one (agoq-cpu where installed)
def test_compiled_decoder_layer_has_no_graph_break_and_eager_gradients(backend, monkeypatch):
    """Was 4 graph breaks (torch 2.13), one per run of eagerly executed LAAQ modules."""
    if backend is not None:
        monkeypatch.setenv("AGOQ_BACKEND", backend)
    torch._dynamo.reset()
    model = small_model("llama", layers=1)
    apply(model)
    layer, x, step = _layer_step(model)
    explain = torch._dynamo.explain(step)(x)
    assert explain.graph_break_count == 0, [str(r.reason).split("\n")[0] for r in explain.break_reasons]
    assert explain.graph_count == 1
    l0 = step(x)
    l0.backward()
    g0 = _grads(layer, x)
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    l1 = compiled(x)
    l1.backward()  # the backward graph holds the norm/act derivatives and the agoq:: codecs
    g1 = _grads(layer, x)
    assert torch.equal(l0.detach(), l1.detach())
    for n in g0:  # same kept bits, same derivative formulas, same summation order
        assert torch.equal(g0[n], g1[n]), n
    remove(model)
    torch._dynamo.reset()


def test_compiled_llama_fullgraph_gives_eager_laaq_bits():
    """The whole LlamaForCausalLM (2 layers, final norm + LM head converted), fullgraph, forward+backward:
    loss and every gradient bit-identical to eager LAAQ. The graphs call the codecs as custom ops:
    forward one agoq::quantize per kept tensor (2 norm inputs + gate + up per layer, the final norm),
    backward one agoq::dequantize per reader (norm backward, q, k, v; norm backward, MLP's rebuild of
    its input, g, u; final norm and LM head). The out-projection input is kept by reference (SDPA)."""
    torch._dynamo.reset()
    model = small_model("llama")
    ids = small_batch()
    apply(model)

    def step(i):
        return model(input_ids=i, labels=i).loss

    l0, g0 = grads_of(model, step, ids)
    ops = {}
    l1, g1 = grads_of(model, torch.compile(step, fullgraph=True, backend=_grabbing_aot(ops)), ids)
    assert torch.equal(l0, l1)
    for n in g0:
        assert torch.equal(g0[n], g1[n]), n
    assert ops["fw"] == ["agoq.quantize.default"] * 9
    assert ops["bw"] == ["agoq.dequantize.default"] * 18
    remove(model)
    torch._dynamo.reset()


def test_compiled_layer_under_bf16_autocast():
    """bf16 autocast: the compiled attention backward (not LAAQ) already differs from eager's, so LAAQ's
    compiled-vs-eager difference is bounded by the plain layer's own (measured on the 2-layer model:
    5.1e-3 vs 5.2e-3)."""
    torch._dynamo.reset()
    model = small_model("llama", layers=1)
    layer, x, step = _layer_step(model)

    def amp_step(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return step(x)

    def errors():
        amp_step(x).backward()
        g0 = _grads(layer, x)
        torch._dynamo.reset()
        torch.compile(amp_step, fullgraph=True, backend="aot_eager")(x).backward()
        g1 = _grads(layer, x)
        return max(rel_err(g0[n], g1[n]) for n in g0)

    plain = errors()
    apply(model)
    laaq = errors()
    assert laaq <= 1.5 * plain + 1e-6, (laaq, plain)
    remove(model)
    torch._dynamo.reset()


def _grabbing_aot(seen: dict):
    """aot_eager, recording the agoq:: ops of the forward and backward graphs into ``seen``."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def grab(kind):
        def compiler(gm, example_inputs):
            seen[kind] = sorted(str(n.target) for n in gm.graph.nodes
                                if n.op == "call_function" and str(n.target).startswith("agoq."))
            return make_boxed_func(gm.forward)
        return compiler

    return aot_autograd(fw_compiler=grab("fw"), bw_compiler=grab("bw"))


def grads_of(model, step, ids):
    model.zero_grad(set_to_none=True)
    loss = step(ids)
    loss.backward()
    g = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return loss.detach(), g


@pytest.mark.slow
def test_inductor_compiled_layer_matches_eager_laaq_within_fp32_rounding():
    """Inductor (the default backend) on CPU: C++ kernels for the code around LAAQ, agoq-cpu's own
    compiled codecs inside the custom ops. Measured max rel. 3.8e-7 on the 2-layer model."""
    torch._dynamo.reset()
    model = small_model("llama", layers=1)
    apply(model)
    layer, x, step = _layer_step(model)
    step(x).backward()
    g0 = _grads(layer, x)
    torch.compile(step, fullgraph=True)(x).backward()
    g1 = _grads(layer, x)
    errs = {n: rel_err(g0[n], g1[n]) for n in g0}
    assert max(errs.values()) < 1e-5, errs
    remove(model)
    torch._dynamo.reset()


def test_lora_layers_still_compile_through_the_eager_path():
    """PEFT wrappers are not traced: their layers run eager LAAQ behind torch.compiler.disable (graph
    breaks), with eager LAAQ's numerics."""
    peft = pytest.importorskip("peft")
    torch._dynamo.reset()
    model = small_model("llama", layers=1)
    model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "gate_proj"]))
    apply(model)
    ids = small_batch()
    l0, g0 = grads_of(model, lambda i: model(input_ids=i, labels=i).loss, ids)
    c = torch.compile(lambda i: model(input_ids=i, labels=i).loss, backend="aot_eager")
    l1, g1 = grads_of(model, c, ids)
    assert torch.equal(l0, l1)
    assert max(rel_err(g0[n], g1[n]) for n in g0) < 1e-6
    remove(model)
    torch._dynamo.reset()


@pytest.mark.parametrize("name", ["phi3"])  # gemma2 too (measured, bit-identical); left out for CI time
def test_other_families_compile_fullgraph(name):
    """Gemma2 (GELU-tanh act, (1 + w) norms, post-norms with no GEMM reader, tied head) and Phi3 (fused
    qkv_proj and gate_up_proj): no graph break, eager LAAQ's loss and gradients. One documented
    exception: Phi3's attention on CPU runs SDPA's math kernel (its mask), which does not keep its output,
    so eager LAAQ keeps the out-projection input at 4 bits; compiled code hides the producer and follows
    the model's attention implementation (SDPA: kept by reference, no 4-bit error), so o_proj's weight
    gradient differs from eager LAAQ's by that role's 4-bit error (measured 0.085-0.10)."""
    from tests.laaq.test_families import build

    torch._dynamo.reset()
    model = build(name)
    ids = small_batch()
    apply(model, LAAQConfig(block=64))

    def step(i):
        return model(input_ids=i, labels=i).loss

    explain = torch._dynamo.explain(step)(ids)
    assert explain.graph_break_count == 0, [str(r.reason).split("\n")[0] for r in explain.break_reasons]
    torch._dynamo.reset()
    l0, g0 = grads_of(model, step, ids)
    l1, g1 = grads_of(model, torch.compile(step, fullgraph=True, backend="aot_eager"), ids)
    assert torch.equal(l0, l1)
    remove(model)
    for n in g0:
        if name == "phi3" and n.endswith("o_proj.weight"):
            assert 0.02 < rel_err(g0[n], g1[n]) < 0.16, n  # the 4-bit error of one role, not a bug
        else:
            assert torch.equal(g0[n], g1[n]), n
    torch._dynamo.reset()


def test_every_compiled_laaq_layer_shares_one_graph():
    """Each decoder layer compiled on its own (as torchtitan and apply_policy do): all LAAQ layers share one
    graph and all of them run compiled. Was: the layer index went into the graph as a constant, Dynamo
    recompiled per layer and, past ``recompile_limit`` (8), ran every later layer -- LAAQ or not -- eagerly
    without an error (H200, 2026-12-01: a 32-layer compiled budget policy kept 2 GB more per bf16 layer
    than planned and ran out of memory)."""
    from agoq_core.laaq.policy import apply_policy

    torch._dynamo.reset()
    n = 12  # > torch._dynamo.config.recompile_limit (8)
    model = small_model("llama", layers=n)
    graphs: list[int] = []  # per graph compiled: how many times it ran

    def backend(gm, example_inputs):
        k = len(graphs)
        graphs.append(0)

        def run(*args):
            graphs[k] += 1
            return gm.forward(*args)

        return run

    choices = ["laaq-c:nf4"] * (n - 3) + ["bf16-c"] * 3
    rep = apply_policy(model, choices, compile_backend=backend, convert_final_norm=False)
    try:
        ids = small_batch()
        model(input_ids=ids, labels=ids).loss.backward()
        assert len(graphs) == 2, graphs  # one for the LAAQ layers, one for the bf16 ones
        assert sum(graphs) == n, graphs  # every layer ran compiled (before: 8 of 12)
    finally:
        rep.undo()
        torch._dynamo.reset()


def test_compiled_forward_under_saved_tensor_hooks():
    """A memory meter or save_on_cpu around the forward of compiled LAAQ layers (agoq train --compile measures its
    second step that way): once traced outside the hooks, the step under them gives the same loss and gradients,
    and the hooks see the forward's saved tensors. (Tracing under the hooks is refused by torch.func, which the
    traced backward uses; docs/laaq.md.)"""
    import torch

    from agoq_core import laaq
    from tests.laaq.conftest import batch, tiny_model

    torch._dynamo.reset()
    model = tiny_model("llama", layers=2, hidden=128, intermediate=256)
    laaq.apply(model)
    for layer in model.model.layers:
        layer.compile(backend="aot_eager")
    ids = batch(b=2, s=32)

    def step(ctx):
        model.zero_grad(set_to_none=True)
        with ctx:
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    import contextlib

    l0, g0 = step(contextlib.nullcontext())  # traces
    packed = []
    l1, g1 = step(torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.numel()) or t, lambda t: t))
    assert packed and torch.equal(l0, l1) and all(torch.equal(g0[n], g1[n]) for n in g0)
    torch._dynamo.reset()
