"""transformers (PyTorch) on a GGUF file: load, patch for a true float64 run, capture lockstep's canonical
stages with forward hooks. Used by make_goldens.py, check_traps.py and compare_oracles.py; documented in
oracles/transformers/README.md.

Everything here is ``torch.no_grad``, CPU, eager attention (our own registered copy of transformers' eager
attention, ``lockstep_eager``, which also records Q/K after RoPE).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import transformers
from torch import nn
from transformers import AttentionInterface, AutoConfig, AutoModelForCausalLM
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

ATTN = "lockstep_eager"

# --- the attention function ----------------------------------------------------------------------------
# A copy of transformers' eager_attention_forward (models/{llama,qwen2,qwen3,gemma2,gemma3,phi3,starcoder2,stablelm}/
# modeling_*.py, 5.23.0: identical bodies up to gemma2/gemma3's softcap, which this copy takes and applies as they
# do: scores * scaling, then softcap * tanh(scores / softcap), then the mask; gpt2's own copy differs only in that
# its softmax runs in the scores' dtype, which is what this one does), with two changes: the softmax runs in the
# query's dtype instead of a forced float32 (identical for a float32 model; PATCH 3 of the float64 run), and Q and
# K as attention receives them (after RoPE where the architecture has one) are handed to the active recorder (the
# K of the current step only: during decode `key` also holds the cached positions), with the mask, scaling and
# softcap each layer was called with (make_goldens checks them).

_RECORDER: "Recorder | None" = None


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    b, h, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def lockstep_eager(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
    if _RECORDER is not None:
        t = query.shape[2]
        _RECORDER.rope(module.layer_idx, query, key[:, :, -t:, :])
        _RECORDER.mask(module.layer_idx, attention_mask)
        _RECORDER.attn_args[module.layer_idx] = (scaling, softcap)
    if scaling is None:
        scaling = module.head_dim**-0.5
    # GPT2Attention has no num_key_value_groups (no GQA): one K/V head per Q head
    groups = getattr(module, "num_key_value_groups", 1)
    k = _repeat_kv(key, groups)
    v = _repeat_kv(value, groups)
    w = torch.matmul(query, k.transpose(2, 3)) * scaling
    if softcap is not None:
        # gemma2 (attn_logit_softcapping) / gemma3 (None): HF's `w / softcap; tanh; * softcap`, the same ops in the
        # same order
        w = torch.tanh(w / softcap) * softcap
    if attention_mask is not None:
        w = w + attention_mask
    # transformers: softmax(w, dim=-1, dtype=torch.float32).to(query.dtype) -- the same for float32
    w = nn.functional.softmax(w, dim=-1, dtype=query.dtype)
    out = torch.matmul(w, v).transpose(1, 2).contiguous()
    return out, w


AttentionInterface.register(ATTN, lockstep_eager)
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN, eager_mask)


# --- float64 patches ------------------------------------------------------------------------------------
# transformers computes a few things in float32 whatever the model's dtype. For the float64 run (the floor),
# each is patched to follow the input's dtype; for a float32 model every patched function computes exactly
# what the original does (same ops, same order), so the float32 goldens are transformers' own numbers.
#   PATCH 1  RMSNorm: Llama/Qwen2/Qwen3 `hidden_states.to(torch.float32)`, Gemma2/Gemma3 `x.float()` /
#            `self.weight.float()` (Gemma2RMSNorm.forward and Gemma3RMSNorm.forward: the same body).
#   PATCH 2  RoPE: `position_ids.float() * inv_freq.to(dtype=torch.float)` and an inv_freq buffer computed
#            in float32 at init (`torch.arange(..., dtype=torch.float)`): recomputed in float64 from the config.
#   PATCH 3  eager softmax `dtype=torch.float32` (lockstep_eager above).
#   PATCH 4  Gemma2/3's embedding scale: a float32 buffer holding sqrt(hidden_size) (converting the model
#            to float64 widens the float32-rounded value): set to the float64 sqrt.


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _llama_rmsnorm_forward(self, hidden_states):
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(_compute_dtype(hidden_states))
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return self.weight * hidden_states.to(input_dtype)


def _gemma3_rmsnorm_forward(self, x):
    c = _compute_dtype(x)
    output = self._norm(x.to(c))
    output = output * (1.0 + self.weight.to(c))
    return output.type_as(x)


def _gemma4_rmsnorm_forward(self, hidden_states):
    # Gemma4RMSNorm.forward (modeling_gemma4.py 5.23): `self._norm(hidden_states.float())`, `* self.weight.float()`
    # when with_scale (V's norm has no weight), `.type_as(hidden_states)`; _norm is x * pow(mean(x^2) + eps, -0.5)
    c = _compute_dtype(hidden_states)
    normed_output = self._norm(hidden_states.to(c))
    if self.with_scale:
        normed_output = normed_output * self.weight.to(c)
    return normed_output.type_as(hidden_states)


def _rope64(inv_base: float, dim: int) -> torch.Tensor:
    return 1.0 / (inv_base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def _rotary_forward_single(self, x, position_ids):
    c = _compute_dtype(x)
    freqs = position_ids[..., None].to(c) * self.inv_freq.to(device=x.device, dtype=c)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * self.attention_scaling
    sin = emb.sin() * self.attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def _rotary_forward_gemma3(self, x, position_ids, layer_type):
    inv_freq = getattr(self, f"{layer_type}_inv_freq")
    attention_scaling = getattr(self, f"{layer_type}_attention_scaling")
    c = _compute_dtype(x)
    freqs = position_ids[..., None].to(c) * inv_freq.to(device=x.device, dtype=c)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * attention_scaling
    sin = emb.sin() * attention_scaling
    return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def _olmo2_rmsnorm_forward(self, hidden_states):
    # Olmo2RMSNorm.forward (modeling_olmo2.py 5.23): Llama's body, but `(self.weight * hidden_states).to(input_dtype)`
    input_dtype = hidden_states.dtype
    hidden_states = hidden_states.to(_compute_dtype(hidden_states))
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
    return (self.weight * hidden_states).to(input_dtype)


def _rotary_forward_single_nocast(self, x, position_ids):
    # Olmo2RotaryEmbedding.forward: Llama's body returning cos, sin in the compute dtype (no cast to x's)
    c = _compute_dtype(x)
    freqs = position_ids[..., None].to(c) * self.inv_freq.to(device=x.device, dtype=c)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling


def _body(fn) -> str:
    """A forward's source without decorators, comments, blank lines, its signature line(s) and indentation: what
    two architectures' copies of one function have in common (transformers' "Copied from" modules)."""
    import inspect
    import re

    src = inspect.getsource(fn)
    body = src[src.index(":\n", src.index("def ")) + 2:] if ":\n" in src[src.index("def "):] else src
    lines = [re.sub(r"#.*$", "", ln).strip() for ln in body.splitlines()]
    return "\n".join(ln for ln in lines if ln)


# Bodies of transformers' float32-forcing forwards (5.23) -> the dtype-following replacement (PATCH 1, 2). A class of
# an architecture not named in install_patches whose forward is one of these, token for token, is patched the same
# way by to_float64 (`source-matched`); see generic_f64_patches.
def _source_patches() -> list[tuple[str, str, object]]:
    o = _ORIGINAL_FORWARDS
    return [
        ("RMSNorm", _body(o["LlamaRMSNorm"]), _llama_rmsnorm_forward),
        ("RMSNorm", _body(o["Olmo2RMSNorm"]), _olmo2_rmsnorm_forward),
        ("RotaryEmbedding", _body(o["LlamaRotaryEmbedding"]), torch.no_grad()(_rotary_forward_single)),
        ("RotaryEmbedding", _body(o["Olmo2RotaryEmbedding"]), torch.no_grad()(_rotary_forward_single_nocast)),
    ]


def _record_originals() -> dict:
    """transformers' own forwards, read before install_patches replaces any (the bodies _source_patches matches)."""
    from transformers.models.llama import modeling_llama as ll
    from transformers.models.olmo2 import modeling_olmo2 as o2

    return {"LlamaRMSNorm": ll.LlamaRMSNorm.forward, "LlamaRotaryEmbedding": ll.LlamaRotaryEmbedding.forward,
            "Olmo2RMSNorm": o2.Olmo2RMSNorm.forward, "Olmo2RotaryEmbedding": o2.Olmo2RotaryEmbedding.forward}


_ORIGINAL_FORWARDS = _record_originals()
_OURS = {_llama_rmsnorm_forward, _gemma3_rmsnorm_forward, _gemma4_rmsnorm_forward}


def generic_f64_patches(model) -> list[str]:
    """PATCH 1-2 for the classes install_patches does not name (an architecture met through its stage map only):
    every module class of `model` named *RMSNorm or *RotaryEmbedding whose forward is, token for token, the body of
    one transformers forward that forces float32 (Llama's or OLMo 2's) gets its dtype-following replacement (for a
    float32 model the same ops in the same order). Returns what was patched; SystemExit naming a class of those
    names whose forward matches none (its float64 run would compute in float32: no floor; --no-f64)."""
    done, table = [], None
    for cls in sorted({type(m) for m in model.modules()}, key=lambda c: c.__name__):
        name = cls.__name__
        kind = "RMSNorm" if name.endswith("RMSNorm") else "RotaryEmbedding" if name.endswith("RotaryEmbedding") else None
        if kind is None:
            continue
        fn = cls.forward
        if getattr(fn, "__wrapped__", None) is not None:
            fn = fn.__wrapped__
        if fn in _OURS or getattr(fn, "__name__", "").startswith(("_rotary_forward", "_olmo2_rmsnorm", "_llama_rmsnorm")):
            continue  # already ours (install_patches, or patched before)
        table = table or _source_patches()
        body = _body(cls.forward)
        for k, b, repl in table:
            if k == kind and b == body:
                cls.forward = repl
                done.append(f"{name}.forward (source-matched to {getattr(repl, '__name__', repl)}): follows the input "
                            f"dtype (PATCH {'1' if kind == 'RMSNorm' else '2'})")
                break
        else:
            raise SystemExit(f"{name}.forward is not a body this oracle knows how to run in float64 (tf_capture "
                             f"_source_patches): no float64 floor for it (--no-f64), or add its replacement")
    return done


def install_patches() -> list[str]:
    """Patch the classes (PATCH 1, 2); returns what was patched."""
    from transformers.models.gemma2 import modeling_gemma2 as g2
    from transformers.models.gemma3 import modeling_gemma3 as g3
    from transformers.models.gemma4 import modeling_gemma4 as g4
    from transformers.models.llama import modeling_llama as ll
    from transformers.models.qwen2 import modeling_qwen2 as q2
    from transformers.models.qwen3 import modeling_qwen3 as q3
    from transformers.models.phi3 import modeling_phi3 as p3
    from transformers.models.stablelm import modeling_stablelm as sl
    from transformers.models.starcoder2 import modeling_starcoder2 as s2

    # phi3, starcoder2, stablelm (issue 25): Phi3RMSNorm.forward is Llama's body; their RotaryEmbedding.forward
    # Llama's (stablelm's inv_freq covers the rotary dims only: to_float64 recomputes it for those); starcoder2 and
    # stablelm normalize with torch's nn.LayerNorm and gpt2 has no RoPE -- both follow the dtype already
    p3.Phi3RMSNorm.forward = _llama_rmsnorm_forward
    for rot in (p3.Phi3RotaryEmbedding, s2.Starcoder2RotaryEmbedding, sl.StableLmRotaryEmbedding):
        rot.forward = torch.no_grad()(_rotary_forward_single)
    ll.LlamaRMSNorm.forward = _llama_rmsnorm_forward
    q2.Qwen2RMSNorm.forward = _llama_rmsnorm_forward
    q3.Qwen3RMSNorm.forward = _llama_rmsnorm_forward  # the same body as Llama's (q_norm/k_norm too)
    g2.Gemma2RMSNorm.forward = _gemma3_rmsnorm_forward  # Gemma2RMSNorm.forward is Gemma3RMSNorm.forward's body
    g3.Gemma3RMSNorm.forward = _gemma3_rmsnorm_forward
    ll.LlamaRotaryEmbedding.forward = torch.no_grad()(_rotary_forward_single)
    q2.Qwen2RotaryEmbedding.forward = torch.no_grad()(_rotary_forward_single)
    q3.Qwen3RotaryEmbedding.forward = torch.no_grad()(_rotary_forward_single)
    g2.Gemma2RotaryEmbedding.forward = torch.no_grad()(_rotary_forward_single)  # one RoPE base (Llama's forward)
    g3.Gemma3RotaryEmbedding.forward = torch.no_grad()(_rotary_forward_gemma3)
    # gemma4 (named in patch_notes("gemma4") only, so the other architectures' recorded notes stay as they were):
    # Gemma4TextRotaryEmbedding.forward has Gemma3's body (per layer type inv_freq / attention_scaling; its
    # dynamic_rope_update decorator does nothing for the default and proportional types)
    g4.Gemma4RMSNorm.forward = _gemma4_rmsnorm_forward
    g4.Gemma4TextRotaryEmbedding.forward = torch.no_grad()(_rotary_forward_gemma3)
    return [
        "LlamaRMSNorm/Qwen2RMSNorm/Qwen3RMSNorm.forward, Gemma3RMSNorm.forward: compute in float64 for float64 input (PATCH 1)",
        "Llama/Qwen2/Qwen3/Gemma3RotaryEmbedding.forward: angles in float64 for float64 input (PATCH 2)",
        "lockstep_eager: softmax in the query's dtype (PATCH 3)",
    ]


install_patches()


def patch_notes(arch: str) -> list[str]:
    """What install_patches patched, as recorded in a model's floor (`f64_patches`): install_patches()' own list
    (unchanged for the architectures made before gemma2, so their reruns give the same manifest entries), with
    Gemma2's classes named for gemma2."""
    notes = install_patches()
    if arch in NEW_PATCH_NOTES:
        return NEW_PATCH_NOTES[arch] + [notes[2]]
    if arch == "gemma2":
        notes = [
            "Gemma2RMSNorm.forward (Gemma3RMSNorm's body): compute in float64 for float64 input (PATCH 1)",
            "Gemma2RotaryEmbedding.forward (Llama's body, one RoPE base): angles in float64 for float64 input (PATCH 2)",
            notes[2],
        ]
    if arch == "gemma4":
        notes = [
            "Gemma4RMSNorm.forward (Q/K/V norms included): compute in float64 for float64 input (PATCH 1)",
            "Gemma4TextRotaryEmbedding.forward (Gemma3's body, per layer type): angles in float64 for float64 input (PATCH 2)",
            notes[2],
        ]
    return notes


# What PATCH 1-2 mean for the architectures added with issue 25's seeded models (patch_notes).
NEW_PATCH_NOTES = {
    "phi3": [
        "Phi3RMSNorm.forward (Llama's body): compute in float64 for float64 input (PATCH 1)",
        "Phi3RotaryEmbedding.forward (Llama's body): angles in float64 for float64 input (PATCH 2)",
    ],
    "starcoder2": [
        "LayerNorm: torch's nn.LayerNorm computes in the input's dtype (no patch needed)",
        "Starcoder2RotaryEmbedding.forward (Llama's body): angles in float64 for float64 input (PATCH 2)",
    ],
    "stablelm": [
        "LayerNorm: torch's nn.LayerNorm computes in the input's dtype (no patch needed)",
        "StableLmRotaryEmbedding.forward (Llama's body; inv_freq over the rotary dims only): angles in float64 for "
        "float64 input (PATCH 2)",
    ],
    "gpt2": [
        "LayerNorm: torch's nn.LayerNorm computes in the input's dtype (no patch needed)",
        "no RoPE (learned absolute positions: wpe, widened exactly like every weight)",
    ],
}


def _gemma4_inv_freq64(cfg, rot) -> list[str]:
    """PATCH 2 for gemma4, per layer type: the sliding layers' default RoPE over their head width, the full layers'
    proportional RoPE (transformers' _compute_proportional_rope_parameters: the first int(factor * D // 2) pairs turn
    with base^(-2i/D), the others have frequency 0), recomputed in float64."""
    done = []
    for lt in rot.layer_types:
        params = cfg.rope_parameters[lt]
        d = cfg.per_layer_config[lt].head_dim
        inv = _rope64(params["rope_theta"], d)
        if params["rope_type"] == "proportional":
            inv[int(params["partial_rotary_factor"] * d // 2):] = 0.0
        else:
            assert params["rope_type"] == "default", params
        old = getattr(rot, f"{lt}_inv_freq")
        assert old.shape == inv.shape and torch.equal(old == 0, inv == 0), (lt, old, inv)
        setattr(rot, f"{lt}_inv_freq", inv)
        done.append(f"{lt}_inv_freq float64 ({params['rope_type']}, theta {params['rope_theta']}, head {d})")
    return done


def to_float64(model) -> list[str]:
    """Convert a loaded float32 model to float64 (weights widen exactly) and redo in float64 what init
    computed in float32: RoPE inverse frequencies (PATCH 2) and Gemma3's embedding scale (PATCH 4)."""
    done = generic_f64_patches(model)
    model.to(torch.float64)
    cfg = model.config
    rot = getattr(model.base_model, "rotary_emb", None)
    # gemma4's head width is per layer (_gemma4_inv_freq64 reads each layer type's): reading the global
    # cfg.head_dim of its heterogeneous config raises AmbiguousGlobalPerLayerAttributeError (transformers 5.23)
    gemma4 = cfg.model_type == "gemma4_text"
    dim = None if gemma4 else getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    # partial rotary (stablelm; phi3's factor is 1.0): the rotary embedding covers int(head_dim * factor) dims
    rp = getattr(cfg, "rope_parameters", None) or {}
    dim_full = dim
    if "partial_rotary_factor" in rp and not gemma4:
        dim = int(dim * rp["partial_rotary_factor"])
    if rot is None:
        done.append("no rotary embedding (learned absolute positions)")
    elif gemma4:
        done += _gemma4_inv_freq64(cfg, rot)
    elif hasattr(rot, "inv_freq"):
        assert rot.rope_type == "default", rot.rope_type
        rot.inv_freq = _rope64(cfg.rope_parameters["rope_theta"], dim)
        part = f", the first {dim} of {dim_full} dims of each head" if dim != dim_full else ""
        done.append(f"inv_freq float64 (theta {cfg.rope_parameters['rope_theta']}{part})")
    else:
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        for lt in rot.layer_types:
            params = cfg.rope_parameters[lt]
            assert params["rope_type"] == "default", params
            setattr(rot, f"{lt}_inv_freq", _rope64(params["rope_theta"], dim))
            done.append(f"{lt}_inv_freq float64 (theta {params['rope_theta']})")
    emb = model.get_input_embeddings()
    if hasattr(emb, "embed_scale"):
        emb.embed_scale = torch.tensor(math.sqrt(cfg.hidden_size), dtype=torch.float64)
        done.append(f"embed_scale = float64 sqrt({cfg.hidden_size})")
    return done


# --- loading --------------------------------------------------------------------------------------------


def gguf_hparams(gguf: Path) -> dict:
    """The few hyperparameters load() checks against transformers' GGUF config, as llama.cpp reads them."""
    from gguf import GGUFReader

    r = GGUFReader(str(gguf))
    arch = r.fields["general.architecture"].contents()

    def get(key):
        f = r.fields.get(f"{arch}.{key}")
        return None if f is None else f.contents()

    return {
        "arch": arch,
        "n_layer": int(get("block_count")),
        "key_length": get("attention.key_length"),
        "sliding_window": get("attention.sliding_window"),
        "sliding_window_pattern": get("attention.sliding_window_pattern"),
        # gemma2 (llama.cpp models/gemma2.cpp load_arch_hparams reads both, optional; transformers' GGUF config
        # map reads neither)
        "attn_logit_softcapping": get("attn_logit_softcapping"),
        "final_logit_softcapping": get("final_logit_softcapping"),
        "rope_freq_base_swa": get("rope.freq_base_swa"),
        # phi3, starcoder2, stablelm, gpt2 (load_new_arch_fixes)
        "rope_freq_base": get("rope.freq_base"),
        "rope_dimension_count": get("rope.dimension_count"),
        "context_length": get("context_length"),
        "feed_forward_length": get("feed_forward_length"),
    }


# llama.cpp 0c1e570's gemma2 defaults (src/models/gemma2.cpp load_arch_hparams; llama-hparams.h): the values it
# uses when the file has no such key.
LLAMACPP_GEMMA2_DEFAULTS = {"sliding_window": 4096, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}


def llamacpp_swa_layer_types(hp: dict, n_default: int) -> list[str]:
    """llama.cpp 0c1e570's load_swa_pattern(ml, n_default) -> hparams.set_swa_pattern (dense_first false): the
    file's sliding_window_pattern array (per layer) if present, otherwise n_pattern = the file's integer pattern or
    n_default, layer il sliding iff n_pattern == 0 or il % n_pattern < n_pattern - 1 (the last of every n_pattern
    is global)."""
    pat = hp["sliding_window_pattern"]
    if isinstance(pat, list):
        return ["sliding_attention" if bool(x) else "full_attention" for x in pat[: hp["n_layer"]]]
    n = n_default if pat is None else int(pat)
    return ["sliding_attention" if n == 0 or il % n < n - 1 else "full_attention" for il in range(hp["n_layer"])]


def llamacpp_gemma3_layer_types(hp: dict) -> list[str] | None:
    """llama.cpp 0c1e570's gemma3 SWA layers (models/gemma3.cpp load_arch_hparams -> load_swa_pattern(ml, 6)):
    no (or a zero) sliding_window -> no SWA at all (None); else llamacpp_swa_layer_types(hp, 6)."""
    if not hp["sliding_window"]:
        return None
    return llamacpp_swa_layer_types(hp, 6)


def llamacpp_gemma2_layer_types(hp: dict) -> list[str]:
    """llama.cpp 0c1e570's gemma2 SWA layers (models/gemma2.cpp load_arch_hparams: swa_type STANDARD, n_swa 4096
    unless the file says otherwise, load_swa_pattern(ml, 2)): layer il local iff il % 2 == 0 (layer 0 local, 1
    global, ...) unless the file has a pattern. SWA is on whether or not the file has a sliding_window."""
    return llamacpp_swa_layer_types(hp, 2)


def load_new_arch_fixes(cfg, hp: dict, gguf: Path) -> list[str]:
    """LOADER FIXES (phi3, starcoder2, stablelm, gpt2; issue 25's seeded models): what transformers 5.23's GGUF
    config maps (integrations/ggml.py GGUF_CONFIG_MAPPING) leave at a config default while llama.cpp reads it from
    the file. Each is set here from the file before the model is built (the config is read at init) and returned as
    a note (`loader_config_fixes`); make_goldens.check_new_arch checks the loaded model against the file.

    - RoPE base (starcoder2, stablelm): their maps have no `rope.freq_base` entry, so rope_theta stays at the
      config default 10000 whatever the file says (the seeded files say 10000: no change, but not by design).
    - stablelm partial rotary: the map sends `rope.dimension_count` nowhere (None), so partial_rotary_factor stays
      at StableLmConfig's default 0.25; llama.cpp rotates the first rope.dimension_count dims of each head
      (n_rot): the factor is set to dimension_count / head_dim (synth-stablelm: 16 / 64 = 0.25, the default again,
      by coincidence).
    - starcoder2 rotary dims: Starcoder2 rotates the whole head; a file whose rope.dimension_count is not head_dim
      is refused.
    - phi3 pad_token_id: the map reads no padding id and Phi3Config's default is 32000 (Phi-3's tokenizer), out of
      range for a 263-token vocabulary: nn.Embedding(padding_idx=32000) refuses to build ("Padding_idx must be
      within num_embeddings"). It is set to None (the padding row only matters to gradients; llama.cpp has none).
    - phi3 sliding window: the map reads none (sliding_window stays None), which is what llama.cpp does too --
      "Phi SWA is currently disabled" (src/models/phi3.cpp, LLAMA_SWA_TYPE_NONE) although the converter writes
      `phi3.attention.sliding_window` (synth-phi3: 4, which the 11-token prompt would cross). Asserted None here, so
      that a loader which starts reading it cannot silently mask differently from llama.cpp.
    - gpt2 n_positions / n_inner: the map sends `context_length` to `n_ctx` and `feed_forward_length` to an unused
      key, so GPT2Config keeps n_positions 1024 (wpe's rows) and n_inner None (= 4 * n_embd): the seeded file's
      position_embd [256 rows] and ffn_up [512] do not load ("size mismatch"). Both are set from the file.
    """
    notes = []
    mt = cfg.model_type

    def put(key, value, why):
        have = getattr(cfg, key, None)
        if have != value:
            notes.append(f"{key} {have} -> {value} ({why})")
            setattr(cfg, key, value)

    if mt in ("phi3", "starcoder2", "stablelm"):
        rp = dict(cfg.rope_parameters)
        base = float(hp["rope_freq_base"]) if hp["rope_freq_base"] is not None else 10000.0
        if rp.get("rope_theta") != base:
            notes.append(f"rope_theta {rp.get('rope_theta')} -> {base} (the file's rope.freq_base)")
            rp["rope_theta"] = base
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        n_rot = int(hp["rope_dimension_count"]) if hp["rope_dimension_count"] is not None else head_dim
        if mt == "stablelm":
            factor = n_rot / head_dim
            if int(head_dim * factor) != n_rot:
                raise SystemExit(f"{gguf}: rope.dimension_count {n_rot} is no whole fraction of head_dim {head_dim}")
            if rp.get("partial_rotary_factor") != factor:
                notes.append(f"partial_rotary_factor {rp.get('partial_rotary_factor')} -> {factor} "
                             f"(the file's rope.dimension_count {n_rot} / head_dim {head_dim})")
                rp["partial_rotary_factor"] = factor
        elif n_rot != head_dim:
            raise SystemExit(f"{gguf}: {mt} with rope.dimension_count {n_rot} != head_dim {head_dim}: transformers' "
                             f"{mt} rotates the whole head")
        cfg.rope_parameters = rp
    if mt == "phi3":
        if cfg.pad_token_id is not None and not 0 <= cfg.pad_token_id < cfg.vocab_size:
            put("pad_token_id", None, f"Phi3Config's default is out of the file's vocabulary of {cfg.vocab_size}")
        if cfg.sliding_window is not None:
            raise SystemExit(f"{gguf}: phi3 config has sliding_window {cfg.sliding_window}; llama.cpp disables Phi SWA")
    if mt == "starcoder2" and cfg.sliding_window is not None:
        raise SystemExit(f"{gguf}: starcoder2 config has sliding_window {cfg.sliding_window}; llama.cpp's starcoder2 has none")
    if mt == "gpt2":
        put("n_positions", int(hp["context_length"]), "the file's context_length: position_embd's rows")
        put("n_inner", int(hp["feed_forward_length"]), "the file's feed_forward_length")
    return notes


# --- gemma4 (the seeded synth-gemma4 and its variants) ---------------------------------------------------------


def gemma4_file(gguf: Path) -> dict:
    """What llama.cpp 0c1e570 reads of a gemma4 file (src/models/gemma4.cpp load_arch_hparams / load_arch_tensors),
    for gemma4_config and make_goldens.check_gemma4: the metadata keys (None where absent), which layers have an
    attn_v / ffn_gate_inp tensor, the rope_freqs values and each layer's layer_output_scale (dequantized, float32)."""
    from gguf import GGUFReader, dequantize

    r = GGUFReader(str(gguf))

    def get(key):
        f = r.fields.get(f"gemma4.{key}")
        return None if f is None else f.contents()

    tensors = {t.name: t for t in r.tensors}

    def deq(name):
        t = tensors[name]
        return np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)

    n_layer = int(get("block_count"))
    return {
        "n_layer": n_layer,
        "n_embd": int(get("embedding_length")),
        "n_head": get("attention.head_count"),
        "n_head_kv": get("attention.head_count_kv"),
        "key_length": get("attention.key_length"),
        "value_length": get("attention.value_length"),
        "key_length_swa": get("attention.key_length_swa"),
        "value_length_swa": get("attention.value_length_swa"),
        "rope_dim": get("rope.dimension_count"),
        "rope_dim_swa": get("rope.dimension_count_swa"),
        "rope_freq_base": get("rope.freq_base"),
        "rope_freq_base_swa": get("rope.freq_base_swa"),
        "rope_scaling": get("rope.scaling.type"),
        "sliding_window": get("attention.sliding_window"),
        "sliding_window_pattern": get("attention.sliding_window_pattern"),
        "shared_kv_layers": get("attention.shared_kv_layers"),
        "embedding_length_per_layer_input": get("embedding_length_per_layer_input"),
        "final_logit_softcapping": get("final_logit_softcapping"),
        "feed_forward_length": get("feed_forward_length"),
        "rms_eps": get("attention.layer_norm_rms_epsilon"),
        "has_attn_v": [f"blk.{il}.attn_v.weight" in tensors for il in range(n_layer)],
        "has_attn_qkv": any(f"blk.{il}.attn_qkv.weight" in tensors for il in range(n_layer)),
        "has_moe": any(f"blk.{il}.ffn_gate_inp.weight" in tensors for il in range(n_layer)),
        "rope_freqs": deq("rope_freqs.weight") if "rope_freqs.weight" in tensors else None,
        "layer_output_scale": [
            deq(f"blk.{il}.layer_output_scale.weight") if f"blk.{il}.layer_output_scale.weight" in tensors else None
            for il in range(n_layer)
        ],
    }


# llama.cpp's rope_freqs factor of a pair that must not turn (conversion/gemma.py Gemma4Model.generate_extra_tensors:
# [1.0] * n_rot + [1e30] * n_unrot): anything this large makes pos * theta / factor < 1e-20 rad at every position.
GEMMA4_UNROTATED_FACTOR_MIN = 1e20


def gemma4_rope_rotated_pairs(f: dict) -> int:
    """The number of leading RoPE pairs a full-attention layer turns: rope_freqs must be n ones then only
    factors >= GEMMA4_UNROTATED_FACTOR_MIN (the converter's proportional RoPE; transformers' `proportional` rope type
    can express nothing else). Refuses any other shape."""
    ff = f["rope_freqs"]
    if ff is None:
        raise SystemExit("gemma4 without rope_freqs.weight: the full-attention layers' RoPE would turn every pair; "
                         "transformers' Gemma 4 full-attention RoPE is `proportional` (not supported here)")
    n = int(np.sum(ff == 1.0))
    if not (np.all(ff[:n] == 1.0) and np.all(ff[n:] >= GEMMA4_UNROTATED_FACTOR_MIN)):
        raise SystemExit(f"gemma4 rope_freqs {ff.tolist()} is not [1]*n + [>= 1e20]*m: transformers' proportional RoPE cannot express it")
    return n


def gemma4_config(cfg, gguf: Path):
    """LOADER FIXES (gemma4): a Gemma4TextConfig holding what llama.cpp reads from the file; returns (config, notes).

    transformers 5.23's GGUF config map for gemma4 (integrations/ggml.py, modeling_gguf_pytorch_utils.py) reads
    block_count, context_length, embedding_length, feed_forward_length, head counts, rms eps, sliding_window and
    `attention.key_length -> global_head_dim`, and nothing else of Gemma 4's; Gemma4TextConfig's defaults (those of
    the released models) fill the rest. For synth-gemma4 (and any file unlike gemma-4's released sizes) they are
    wrong:
    - head_dim (the sliding layers' head width): default 256; llama.cpp: attention.key_length_swa (64);
    - the full layers' head width (per_layer_config[il].head_dim): from key_length (128) -- right as loaded, set here
      anyway (with layer_types, which per_layer_config is keyed on);
    - attention_k_eq_v: default False; llama.cpp: a layer without attn_v takes V = the K projection (gemma4.cpp:
      `wv ? wv*cur : Kcur`); transformers does so on every full-attention layer iff attention_k_eq_v, so it is set
      from the file, which must have attn_v on every sliding layer and on no full layer or on all of them;
    - final_logit_softcapping: default None; llama.cpp: the file's (30);
    - hidden_size_per_layer_input: default 256 (per-layer embeddings on); the file's
      embedding_length_per_layer_input (0: none, and llama.cpp has no per_layer tensors);
    - rope_parameters: default sliding {default, theta 1e4}, full {proportional, 0.25, theta 1e6}; llama.cpp: the
      sliding layers' base rope.freq_base_swa (default 10000), the full layers' rope.freq_base (10000 in the file),
      and the full layers' turning pairs from rope_freqs.weight (n ones of key_length/2: partial_rotary_factor =
      2n / key_length; 16 of 64 -> 0.25, the converter's inverse);
    - layer_types: Gemma4TextConfig's default pattern of 6 with the last layer forced global; llama.cpp: the
      file's attention.sliding_window_pattern array (here [True, False] -- the same, not relied upon);
    - num_kv_shared_layers (the file's attention.shared_kv_layers, 0) and enable_moe_block (no ffn_gate_inp):
      checked, as they are what the defaults give.
    Refused (no config of transformers' Gemma 4 expresses them): a sliding layer whose RoPE does not cover its
    whole head (rope.dimension_count_swa < key_length_swa: transformers' default RoPE turns every pair), full layers
    whose rope.dimension_count is not their head width, rope_freqs of another shape than ones-then-1e30, a file
    whose last layer is sliding (Gemma4TextConfig forces it global), attn_v on some full layers only, fused QKV,
    per-layer head counts, RoPE scaling, key/value widths that differ. make_goldens.check_gemma4 checks each value
    on the built model."""
    from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig

    f = gemma4_file(gguf)
    n_layer = f["n_layer"]
    pat = f["sliding_window_pattern"]
    if not isinstance(pat, list) or len(pat) != n_layer:
        raise SystemExit(f"{gguf}: gemma4.attention.sliding_window_pattern {pat!r} is not one bool per layer (llama.cpp requires it)")
    layer_types = ["sliding_attention" if bool(x) else "full_attention" for x in pat]
    if layer_types[-1] != "full_attention":
        raise SystemExit(f"{gguf}: the last layer is sliding: Gemma4TextConfig forces it to full attention")
    for k in ("n_head", "n_head_kv", "feed_forward_length"):
        if isinstance(f[k], list):
            raise SystemExit(f"{gguf}: per-layer {k} {f[k]}: not supported here")
    if f["value_length"] not in (None, f["key_length"]) or f["value_length_swa"] not in (None, f["key_length_swa"]):
        raise SystemExit(f"{gguf}: key and value widths differ (llama.cpp refuses them too)")
    if f["rope_scaling"] not in (None, "none") or f["has_attn_qkv"]:
        raise SystemExit(f"{gguf}: RoPE scaling {f['rope_scaling']} / fused attn_qkv: not supported here")
    hd, hd_swa = int(f["key_length"]), int(f["key_length_swa"])
    rope_dim_swa = int(f["rope_dim_swa"] if f["rope_dim_swa"] is not None else f["rope_dim"])
    if rope_dim_swa != hd_swa or int(f["rope_dim"]) != hd:
        raise SystemExit(f"{gguf}: rope.dimension_count(_swa) {f['rope_dim']}/{rope_dim_swa} != key_length(_swa) {hd}/{hd_swa}: "
                         "transformers' Gemma 4 RoPE covers the whole head")
    full = [il for il, t in enumerate(layer_types) if t == "full_attention"]
    sliding = [il for il, t in enumerate(layer_types) if t == "sliding_attention"]
    if not all(f["has_attn_v"][il] for il in sliding):
        raise SystemExit(f"{gguf}: a sliding layer without attn_v: transformers' Gemma 4 has V = K on full layers only")
    v_from_k = {not f["has_attn_v"][il] for il in full}
    if len(v_from_k) > 1:
        raise SystemExit(f"{gguf}: attn_v on some full-attention layers only: transformers' attention_k_eq_v is global")
    n_rot = gemma4_rope_rotated_pairs(f)
    want = {
        "head_dim": hd_swa,
        "per_layer_config": {il: {"head_dim": hd} for il in full},
        "layer_types": layer_types,
        "attention_k_eq_v": bool(v_from_k.pop()) if full else False,
        "final_logit_softcapping": None if not f["final_logit_softcapping"] else float(f["final_logit_softcapping"]),
        "hidden_size_per_layer_input": int(f["embedding_length_per_layer_input"] or 0),
        "num_kv_shared_layers": int(f["shared_kv_layers"] or 0),
        "enable_moe_block": bool(f["has_moe"]),
        "sliding_window": int(f["sliding_window"]),
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": float(10000.0 if f["rope_freq_base_swa"] is None else f["rope_freq_base_swa"])},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 2 * n_rot / hd,
                               "rope_theta": float(f["rope_freq_base"])},
        },
    }
    if want["num_kv_shared_layers"] or want["enable_moe_block"] or want["hidden_size_per_layer_input"]:
        raise SystemExit(f"{gguf}: gemma4 with KV sharing / MoE / per-layer embeddings: not supported here (nor by lockstep's engine)")
    d = cfg.to_dict()
    notes = []
    for k, v in want.items():
        have = d.get(k)
        if k == "per_layer_config":
            have = {int(i): c for i, c in (have or {}).items()}
        if have != v:
            notes.append(f"{k} {have} -> {v}")
        d[k] = v
    return Gemma4TextConfig(**d), notes


def gemma4_layer_scalars(model, gguf: Path) -> list[str]:
    """LOADER FIX (gemma4): transformers' GGUF tensor map never loads `layer_scalar`. get_gguf_hf_weights_map maps
    the buffer `model.layers.N.layer_scalar` (no `.weight` suffix) to `blk.N.layer_output_scale`, while the file's
    tensor is `blk.N.layer_output_scale.weight`, so the name lookup misses and the buffer keeps its init value 1.0
    (from_pretrained reports it MISSING). llama.cpp multiplies each block's output by it (gemma4.cpp `out_scaled`).
    Set here from the file (dequantized); make_goldens.check_gemma4 checks every layer's."""
    f = gemma4_file(gguf)
    notes = []
    for il, layer in enumerate(model.model.layers):
        s = f["layer_output_scale"][il]
        if s is None:  # llama.cpp: TENSOR_NOT_REQUIRED, no multiply
            s = np.ones(1, np.float32)
        old = layer.layer_scalar.detach().clone()
        with torch.no_grad():
            layer.layer_scalar.copy_(torch.from_numpy(s.copy()).reshape(layer.layer_scalar.shape))
        if not torch.equal(old, layer.layer_scalar):
            notes.append(f"layers.{il}.layer_scalar {old.tolist()} -> {layer.layer_scalar.tolist()} (blk.{il}.layer_output_scale)")
    return notes


def load(gguf: Path, dtype=torch.float32):
    gguf = Path(gguf)
    # LOADER FIX (qwen3): transformers 5.23's GGUF config map for qwen3 (integrations/ggml.py) has no
    # `attention.key_length` -> head_dim entry (qwen3_moe has one), so the config keeps Qwen3Config's default
    # head_dim 128 whatever the file says. Real Qwen3 checkpoints have head_dim 128 and load; lockstep's seeded
    # synth-qwen3 has head_dim 64 and does NOT (size mismatch of q_proj/k_proj/v_proj/o_proj/q_norm/k_norm).
    # We set head_dim from the file's key_length, for any architecture whose file has one and whose config
    # disagrees, and record it in the notes (make_goldens.check_traps then checks head_dim == key_length).
    cfg = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    load_notes = []
    hp = gguf_hparams(gguf)
    key_length = hp["key_length"]
    if cfg.model_type == "gemma4_text":
        # gemma4: two head widths (key_length_swa, key_length) -- gemma4_config, not the generic head_dim fix below
        cfg, g4_notes = gemma4_config(cfg, gguf)
        load_notes += g4_notes
        key_length = None
    head_dim = None if key_length is None else getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if key_length is not None and head_dim != int(key_length):
        load_notes.append(f"head_dim {head_dim} (transformers' GGUF config) -> {key_length} (the file's attention.key_length)")
        cfg.head_dim = int(key_length)
    if cfg.model_type == "gemma3_text":
        # SLIDING WINDOW (gemma3): the loader maps attention.sliding_window -> sliding_window but knows nothing of
        # llama.cpp's SWA layer pattern; Gemma3TextConfig derives layer_types from its own default
        # (sliding_window_pattern 6: every 6th layer global), which happens to be llama.cpp's default too. We do
        # not rely on the coincidence: layer_types is set here from llama.cpp's rule on the file's keys
        # (llamacpp_gemma3_layer_types; a seeded 2-layer gemma3 with window 4 -> both layers sliding), and
        # sliding_window from the file. The window itself means the same in both: llama.cpp masks key p0 for
        # query p1 when p1 - p0 >= n_swa (LLAMA_SWA_TYPE_STANDARD), transformers keeps kv_idx > q_idx - window
        # (masking_utils.sliding_window_overlay): n_swa keys including the query's own position.
        want = llamacpp_gemma3_layer_types(hp)
        if want is None:
            raise SystemExit(f"{gguf}: gemma3 without a sliding window: not supported here (transformers' Gemma 3 always has one)")
        if cfg.sliding_window != int(hp["sliding_window"]):
            load_notes.append(f"sliding_window {cfg.sliding_window} -> {hp['sliding_window']} (the file's)")
            cfg.sliding_window = int(hp["sliding_window"])
        if list(cfg.layer_types) != want:
            load_notes.append(f"layer_types {cfg.layer_types} -> {want} (llama.cpp's SWA pattern)")
            cfg.layer_types = want
    if cfg.model_type == "gemma2":
        # LOADER FIXES (gemma2): transformers 5.23's GGUF config map for gemma2 (integrations/ggml.py) reads
        # neither `gemma2.attn_logit_softcapping` nor `gemma2.final_logit_softcapping`, so Gemma2Config keeps its
        # defaults 50.0 / 30.0 whatever the file says (synth-gemma2: attention 5.0, final 10.0); nor any
        # query_pre_attn_scalar (the GGUF has none: the default 256 is Gemma 2 2B/9B's head_dim, while llama.cpp
        # scales Q by 1/sqrt(the file's key_length) for every size but 27B, models/gemma2.cpp). Set here from the
        # file (llama.cpp's defaults where the file has no key, LLAMACPP_GEMMA2_DEFAULTS), before the model is
        # built (Gemma2Attention reads scaling and attn_logit_softcapping at init; Gemma2ForCausalLM.forward reads
        # final_logit_softcapping from the config). SWA as for gemma3: layer_types from llama.cpp's rule
        # (llamacpp_gemma2_layer_types: layer 0 local, 1 global; Gemma2Config's default alternation is the same)
        # and sliding_window from the file (llama.cpp's 4096 if absent). make_goldens.check_traps checks each.
        if hp["rope_freq_base_swa"] is not None:
            raise SystemExit(f"{gguf}: gemma2 with rope.freq_base_swa: transformers' Gemma 2 has one RoPE base for every layer")
        d = LLAMACPP_GEMMA2_DEFAULTS
        want = {
            "attn_logit_softcapping": float(d["attn_logit_softcapping"] if hp["attn_logit_softcapping"] is None else hp["attn_logit_softcapping"]),
            "final_logit_softcapping": float(d["final_logit_softcapping"] if hp["final_logit_softcapping"] is None else hp["final_logit_softcapping"]),
            "sliding_window": int(d["sliding_window"] if not hp["sliding_window"] else hp["sliding_window"]),
            "query_pre_attn_scalar": int(cfg.head_dim),
            "layer_types": llamacpp_gemma2_layer_types(hp),
        }
        for k, v in want.items():
            have = getattr(cfg, k)
            if (list(have) if k == "layer_types" else have) != v:
                src = {"query_pre_attn_scalar": "head_dim = the file's key_length", "layer_types": "llama.cpp's SWA pattern"}.get(
                    k, "the file's" if hp.get(k) is not None else "llama.cpp's default")
                load_notes.append(f"{k} {have} -> {v} ({src})")
                setattr(cfg, k, v)
    if cfg.model_type in ("phi3", "starcoder2", "stablelm", "gpt2"):
        load_notes += load_new_arch_fixes(cfg, hp, gguf)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, config=cfg, dtype=torch.float32, attn_implementation=ATTN
    )
    model.eval()
    if model.config.model_type == "gemma4_text":
        load_notes += gemma4_layer_scalars(model, gguf)
    model.lockstep_load_notes = load_notes
    notes = []
    cfg = model.config
    if cfg.model_type == "gemma3_text":
        # Gemma 3 scales Q by query_pre_attn_scalar**-0.5; llama.cpp by 1/sqrt(head_dim) (the file's key_length).
        # The GGUF carries no query_pre_attn_scalar: the config default (256) is right for 270m only because its
        # head_dim is 256. Take it from head_dim whatever the default (make_goldens.check_traps verifies).
        if cfg.query_pre_attn_scalar != cfg.head_dim:
            notes.append(f"query_pre_attn_scalar {cfg.query_pre_attn_scalar} -> head_dim {cfg.head_dim}")
            cfg.query_pre_attn_scalar = cfg.head_dim
            for layer in model.model.layers:
                layer.self_attn.scaling = cfg.head_dim**-0.5
    if dtype == torch.float64:
        notes = to_float64(model)
    return model, notes


# --- stage capture --------------------------------------------------------------------------------------


def llama_gguf_order(x: torch.Tensor, n_head: int) -> torch.Tensor:
    """transformers' Q/K layout (per head: the two RoPE halves [2, D/2]) -> the GGUF file's (llama.cpp's
    convert_hf_to_gguf permutes llama Q/K rows to interleaved pairs [D/2, 2]); last dim = n_head * D."""
    *lead, w = x.shape
    d = w // n_head
    return x.reshape(*lead, n_head, 2, d // 2).transpose(-1, -2).reshape(*lead, w)


# --- stage maps (data: stage_maps/<model_type>.toml; README "Stage maps") ---------------------------------
# Where each canonical stage is read: one file per architecture, keyed by config.json's model_type. Every stage
# names a module path ({N} = layer) and a hook kind; this code knows the hook kinds and nothing of any
# architecture. The map's rows (with their `describe` text) are the manifest's stage_map.transformers.<arch>.

STAGE_MAP_DIR = Path(__file__).resolve().parent / "stage_maps"
# hook kind -> the manifest's `op` (stage_map.transformers.<arch>.stages[].op)
HOOKS = {
    "output": "forward_hook",  # the module's forward output (a tuple's first element)
    "input": "forward_pre_hook",  # the module's first positional input
    "attn_query": "attention_function",  # Q as lockstep_eager receives it (after RoPE) at layer N
    "attn_key": "attention_function",  # K as lockstep_eager receives it, this step's rows only
    "columns": "forward_hook_columns",  # a column range of the module's output (fused projections; `columns`)
    "logits_result": "model_output",  # the model's output logits (after a final soft-cap); lm_head's kept aside
    "pooled": "computed_from_output",  # mean over the sequence of the encoder's last_hidden_state
}
MAP_KEYS = {"model_type", "arch", "class", "qk_layout", "about", "from_pretrained", "stage"}
STAGE_KEYS = {"id", "module", "hook", "columns", "heads_first", "fallback", "describe"}
QK_LAYOUTS = ("hf", "llama_gguf")


def _qkv_widths(cfg) -> tuple[int, int]:
    n_q = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_q
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_q
    return n_q * hd, n_kv * hd


def _ff(cfg) -> int:
    return cfg.intermediate_size


# `columns = "<name>"` of a "columns" stage: name -> (columns [lo, hi) of the module output given the config,
# description). Fused projections, split the way llama.cpp's build_qkv / ggml_swiglu do: [q | k | v], [gate | up].
COLUMNS = {
    "q": (lambda c: (0, _qkv_widths(c)[0]), "columns [0, n_head*head_dim)"),
    "k": (lambda c: (_qkv_widths(c)[0], sum(_qkv_widths(c))), "columns [n_head*head_dim, +n_kv_head*head_dim)"),
    "v": (lambda c: (sum(_qkv_widths(c)), sum(_qkv_widths(c)) + _qkv_widths(c)[1]), "the last n_kv_head*head_dim columns"),
    "ffn_gate": (lambda c: (0, _ff(c)), "columns [0, n_ff) (the first half: chunk(2)[0])"),
    "ffn_up": (lambda c: (_ff(c), 2 * _ff(c)), "columns [n_ff, 2*n_ff) (the second half: chunk(2)[1])"),
}


@dataclass(frozen=True)
class Stage:
    """One row of a stage map: canonical id (`{N}` = layer), module path, hook kind (HOOKS) and its options."""

    id: str
    module: str
    hook: str
    columns: str | None = None  # "columns": a COLUMNS name
    heads_first: bool | None = None  # per-head norms: True = output [B, H, T, D] (transposed), False = [B, T, H, D]
    fallback: str | None = None  # "output": the module read where `module` is None on a layer (gemma4's v_proj)
    describe: str | None = None  # the manifest's oracle_name (default: module)

    @property
    def oracle_name(self) -> str:
        return self.describe or self.module


@dataclass(frozen=True)
class StageMap:
    """A stage map file (stage_maps/<model_type>.toml), validated."""

    path: Path
    model_type: str  # config.json's model_type
    arch: str  # lockstep's architecture name (GGUF general.architecture; the manifest's stage_map key)
    cls: str  # the transformers class loaded: AutoModelForCausalLM, BertModel, ...
    qk_layout: str  # "hf" or "llama_gguf" (q/k/q_rope/k_rope rows reordered to GGUF's interleaved pairs)
    about: str  # appended to the manifest's stage-map `about` ("" if none)
    from_pretrained: dict  # extra keyword arguments of from_pretrained (BertModel: add_pooling_layer = false)
    stages: tuple[Stage, ...]

    def has(self, hook: str) -> bool:
        return any(s.hook == hook for s in self.stages)

    @property
    def encoder(self) -> bool:
        """An encoder (a pooled output, no logits, no cache): run with run_encoder."""
        return self.has("pooled")

    def canonical_ids(self, n_layer: int) -> list[str]:
        """embed, then every layer's stages in map order, then the rest (output_norm, logits, pooled)."""
        head = [s.id for s in self.stages if s.id == "embed"]
        layer = [s.id for s in self.stages if "{N}" in s.id]
        tail = [s.id for s in self.stages if "{N}" not in s.id and s.id != "embed"]
        return head + [c.replace("{N}", str(n)) for n in range(n_layer) for c in layer] + tail


def read_stage_map(path: Path) -> StageMap:
    """Read and check one stage map file; a SystemExit naming the file and the key on anything malformed."""
    import tomllib

    path = Path(path)
    try:
        d = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SystemExit(f"{path}: not a readable TOML stage map: {e}") from e

    def bad(what: str):
        raise SystemExit(f"{path}: {what} (oracles/transformers/README.md \"Stage maps\")")

    for k in ("model_type", "class", "stage"):
        if k not in d:
            bad(f"no `{k}`")
    if set(d) - MAP_KEYS:
        bad(f"unknown keys {sorted(set(d) - MAP_KEYS)}; known: {sorted(MAP_KEYS)}")
    qk = d.get("qk_layout", "hf")
    if qk not in QK_LAYOUTS:
        bad(f"qk_layout {qk!r} is not one of {QK_LAYOUTS}")
    if not isinstance(d["stage"], list) or not d["stage"]:
        bad("`stage` must be a non-empty array of [[stage]] tables")
    stages, seen = [], set()
    for i, s in enumerate(d["stage"]):
        where = f"[[stage]] #{i + 1} ({s.get('id', '?')})"
        if set(s) - STAGE_KEYS:
            bad(f"{where}: unknown keys {sorted(set(s) - STAGE_KEYS)}; known: {sorted(STAGE_KEYS)}")
        for k in ("id", "module", "hook"):
            if not isinstance(s.get(k), str):
                bad(f"{where}: `{k}` missing or not a string")
        if s["hook"] not in HOOKS:
            bad(f"{where}: hook {s['hook']!r} is not one of {list(HOOKS)}")
        if s["id"] in seen:
            bad(f"{where}: id {s['id']!r} given twice")
        seen.add(s["id"])
        if s["hook"] == "columns" and s.get("columns") not in COLUMNS:
            bad(f"{where}: hook columns needs columns = one of {list(COLUMNS)}, got {s.get('columns')!r}")
        if s["hook"] != "columns" and "columns" in s:
            bad(f"{where}: `columns` is for hook = \"columns\" only")
        if ("heads_first" in s or "fallback" in s) and s["hook"] != "output":
            bad(f"{where}: `heads_first` / `fallback` are for hook = \"output\" only")
        if s["hook"] in ("attn_query", "attn_key") and "{N}" not in s["id"]:
            bad(f"{where}: an attention hook is per layer: its id needs {{N}}")
        if s["hook"] not in ("pooled", "logits_result") and not s["module"]:
            bad(f"{where}: empty module")
        stages.append(Stage(**s))
    fp = d.get("from_pretrained", {})
    if not isinstance(fp, dict):
        bad("`from_pretrained` must be a table")
    return StageMap(path, d["model_type"], d.get("arch", d["model_type"]), d["class"], qk, d.get("about", ""), fp,
                    tuple(stages))


def stage_maps(directory: Path = STAGE_MAP_DIR) -> dict[str, StageMap]:
    """Every stage map of a directory, keyed by model_type (each file must be named <model_type>.toml)."""
    out = {}
    for p in sorted(Path(directory).glob("*.toml")):
        m = read_stage_map(p)
        if p.stem != m.model_type:
            raise SystemExit(f"{p}: model_type {m.model_type!r}: the file must be named {m.model_type}.toml")
        out[m.model_type] = m
    return out


# Maps given on the command line (make_goldens.py --stage-map FILE): they take the place of stage_maps/'s for their
# architecture (use_stage_map).
_OVERRIDES: dict[str, StageMap] = {}


def use_stage_map(smap: StageMap) -> None:
    """Make `smap` the stage map of its architecture (and model_type) for the rest of the run."""
    _OVERRIDES[smap.arch] = smap
    _OVERRIDES[smap.model_type] = smap


def stage_map(name: "str | StageMap") -> StageMap:
    """The stage map of lockstep's architecture `name` (a map's `arch`, e.g. gemma3) or of config.json's model_type
    (gemma3_text); a StageMap is returned as is. SystemExit if stage_maps/ has none."""
    if isinstance(name, StageMap):
        return name
    if name in _OVERRIDES:
        return _OVERRIDES[name]
    maps = stage_maps()
    for m in maps.values():
        if m.arch == name:
            return m
    if name in maps:
        return maps[name]
    raise SystemExit(f"architecture {name!r} has no stage map in {STAGE_MAP_DIR} (write one, or propose it: "
                     f"propose_stage_map.py --hf-dir DIR; README \"Stage maps\")")


def has_rope(arch) -> bool:
    return stage_map(arch).has("attn_query")


def kind_of_id(cid: str) -> str:
    """blk.3.ffn_up -> ffn_up; embed -> embed."""
    parts = cid.split(".")
    return ".".join(parts[2:]) if parts[0] == "blk" else cid


def canonical_ids(arch, n_layer: int) -> list[str]:
    return stage_map(arch).canonical_ids(n_layer)


@dataclass
class Recorder:
    smap: StageMap
    n_q: int
    n_kv: int
    rows: dict = field(default_factory=dict)  # canonical id -> tensor [T, W]
    masks: dict = field(default_factory=dict)  # layer -> bool [T, S]: which keys each query may see (None: no mask)
    attn_args: dict = field(default_factory=dict)  # layer -> (scaling, softcap) lockstep_eager was called with
    lm_head: torch.Tensor | None = None  # lm_head's output [T, V] (before gemma2's final soft-capping)
    attn_in: dict = field(default_factory=dict)  # layer -> (Q [T, H*D], K [T, Hkv*D]) as attention received them

    def put(self, cid: str, x: torch.Tensor) -> None:
        # x: [T, ...] (the batch dimension already dropped) -> [T, W]
        x = x.detach()
        x = x.reshape(x.shape[0], -1)
        if self.smap.qk_layout == "llama_gguf" and cid.split(".")[-1] in ("q", "k", "q_rope", "k_rope"):
            x = llama_gguf_order(x, self.n_q if cid.split(".")[-1].startswith("q") else self.n_kv)
        assert cid not in self.rows, cid
        self.rows[cid] = x.clone()

    def mask(self, layer: int, attention_mask) -> None:
        # the additive mask lockstep_eager adds to the scores ([1, 1, T, S]; 0 = attend, dtype min = masked)
        if attention_mask is None:
            self.masks[layer] = None
        else:
            m = attention_mask.detach()
            assert m.shape[0] == 1 and m.shape[1] == 1, m.shape
            self.masks[layer] = (m[0, 0] == 0).numpy() if m.dtype != torch.bool else m[0, 0].numpy()

    def rope(self, layer: int, q: torch.Tensor, k: torch.Tensor) -> None:
        # [1, H, T, D] -> [T, H*D], head-major (ggml [D, H, T] flattened); kept aside as `attn_in` for every
        # architecture (make_goldens.check_fused_views), stored under the map's attn_query / attn_key ids (q_rope,
        # k_rope where the architecture has RoPE; none for gpt2: learned absolute positions)
        qf, kf = q[0].transpose(0, 1), k[0].transpose(0, 1)
        self.attn_in[layer] = (qf.reshape(qf.shape[0], -1).detach().clone(), kf.reshape(kf.shape[0], -1).detach().clone())
        for s in self.smap.stages:
            if s.hook in ("attn_query", "attn_key"):
                self.put(s.id.replace("{N}", str(layer)), qf if s.hook == "attn_query" else kf)


def _submodule_or_none(model, path: str):
    """model.get_submodule(path), or None where the last attribute exists and is None (gemma4's v_proj on the
    attention_k_eq_v layers); an AttributeError naming the path otherwise."""
    parent, _, name = path.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    if hasattr(owner, name) and getattr(owner, name) is None:
        return None
    return model.get_submodule(path)


def attach(model, arch, rec_getter) -> list:
    """Register the hooks of the stage map (`arch`: a StageMap or a name for stage_map()); each hands its tensor to
    rec_getter() (the active Recorder). The map's module paths must exist in the model (AttributeError otherwise)."""
    smap = stage_map(arch)
    handles = []
    n_layer = model.config.num_hidden_layers
    for s in smap.stages:
        if s.hook in ("attn_query", "attn_key", "pooled"):
            continue
        if s.hook == "logits_result":
            # the logits are the model's output (run); lm_head's own output is kept aside (Recorder.lm_head)
            def head_hook(m, args, out):
                assert out.shape[0] == 1, out.shape
                rec_getter().lm_head = out[0].detach().clone()
            handles.append(model.get_submodule(s.module).register_forward_hook(head_hook))
            continue
        for n in range(n_layer) if "{N}" in s.id else [None]:
            c = s.id.replace("{N}", str(n)) if n is not None else s.id
            p = s.module.replace("{N}", str(n)) if n is not None else s.module
            mod = _submodule_or_none(model, p)
            if mod is None and s.fallback:
                mod = model.get_submodule(s.fallback.replace("{N}", str(n)) if n is not None else s.fallback)
            if mod is None:
                raise SystemExit(f"{smap.path}: stage {c}: module {p} is None in this model and the map gives no fallback")
            if s.hook == "columns":
                lo, hi = COLUMNS[s.columns][0](model.config)

                def cols(m, args, out, c=c, lo=lo, hi=hi):
                    o = out[0] if isinstance(out, tuple) else out
                    assert o.shape[0] == 1 and o.shape[-1] >= hi, (c, o.shape, lo, hi)
                    rec_getter().put(c, o[0][..., lo:hi])
                handles.append(mod.register_forward_hook(cols))
            elif s.hook == "output":
                def hook(m, args, out, c=c, heads_first=s.heads_first):
                    o = out[0] if isinstance(out, tuple) else out
                    assert o.shape[0] == 1, (c, o.shape)
                    o = o[0]
                    if heads_first:  # gemma3's q_norm/k_norm: [H, T, D] -> [T, H, D]
                        assert o.dim() == 3, (c, o.shape)
                        o = o.transpose(0, 1)
                    elif heads_first is False:  # qwen3/gemma4's: [T, H, D] as normed, per head
                        assert o.dim() == 3 and o.shape[-1] == m.weight.shape[0], (c, o.shape)
                    rec_getter().put(c, o)
                handles.append(mod.register_forward_hook(hook))
            else:
                def pre(m, args, kwargs, c=c):
                    # the first positional input, or hidden_states given by keyword (OLMo 2's self_attn)
                    x = args[0] if args else kwargs.get("hidden_states", next(iter(kwargs.values()), None))
                    assert isinstance(x, torch.Tensor) and x.shape[0] == 1, (c, type(x))
                    rec_getter().put(c, x[0])
                handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
    return handles


def load_hf(hf_dir: Path, arch, dtype=torch.float32):
    """The model of a Hugging Face directory (config.json + *.safetensors) as the stage map says (`class`,
    `from_pretrained` keywords), float32, eager attention (lockstep_eager for decoders, transformers' "eager" for
    encoders, which record no Q/K), eval mode; float64: every weight widened exactly, then to_float64's patches.
    Returns (model, float64 notes)."""
    smap = stage_map(arch)
    cls = getattr(transformers, smap.cls, None)
    if cls is None:
        raise SystemExit(f"{smap.path}: class {smap.cls!r} is not in transformers {transformers.__version__}")
    attn = "eager" if smap.encoder else ATTN
    model = cls.from_pretrained(str(hf_dir), dtype=torch.float32, attn_implementation=attn, **smap.from_pretrained)
    model.eval()
    if getattr(model.config, "model_type", None) != smap.model_type:
        raise SystemExit(f"{hf_dir}/config.json: model_type {model.config.model_type!r}, stage map {smap.path} is for "
                         f"{smap.model_type!r}")
    notes = []
    if dtype == torch.float64:
        notes = ["float64 (weights widened exactly)"] if smap.encoder else to_float64(model)
        if smap.encoder:
            model = model.double()
    return model, notes


def load_hf_encoder(hf_dir: Path, dtype=torch.float32):
    """BertModel from lockstep's Hugging Face copy (config.json + model.safetensors), without the pooler
    (llama.cpp's converter drops it; the stage map's from_pretrained add_pooling_layer = false), eager attention,
    in `dtype` (float64: every weight widened exactly)."""
    return load_hf(hf_dir, "bert", dtype)[0]


@dataclass
class RunResult:
    stages: dict  # canonical id -> np [T, W]
    decode_stages: dict  # canonical id -> np [N, W]
    logits: np.ndarray  # [T, V]
    decode_logits: np.ndarray  # [N, V]
    prefill_masks: dict = field(default_factory=dict)  # layer -> bool [T, T] (Recorder.masks of the prefill call)
    attn_args: list = field(default_factory=list)  # per call: {layer: (scaling, softcap)} lockstep_eager was given
    lm_head_logits: np.ndarray | None = None  # "result" logits only: lm_head's output [T, V], before the final cap
    lm_head_decode_logits: np.ndarray | None = None  # [N, V]
    attn_in: list = field(default_factory=list)  # per call: {layer: (Q, K)} as attention received them (np)


def run_encoder(model, arch, tokens: list[int]) -> RunResult:
    """One forward call of an encoder over `tokens` (attention mask all ones, token types 0, positions 0..T-1,
    as llama.cpp feeds them), recording every stage; `pooled` = the mean of the last hidden state over the
    sequence, [1, D]. The RunResult has no logits ([T, 0]) and no decode rows."""
    global _RECORDER
    smap = stage_map(arch)
    cfg = model.config
    handles = attach(model, smap, lambda: _RECORDER)
    try:
        with torch.no_grad():
            _RECORDER = Recorder(smap, cfg.num_attention_heads, cfg.num_attention_heads)
            ids = torch.tensor([tokens])
            out = model(input_ids=ids, attention_mask=torch.ones_like(ids), token_type_ids=torch.zeros_like(ids))
            last = out.last_hidden_state[0]
            if not torch.equal(last, _RECORDER.rows[f"blk.{cfg.num_hidden_layers - 1}.out"]):
                raise AssertionError("the last layer's output is not BertModel's last_hidden_state")
            for s in smap.stages:
                if s.hook == "pooled":
                    _RECORDER.put(s.id, last.mean(dim=0, keepdim=True))
            rec = _RECORDER
    finally:
        _RECORDER = None
        for h in handles:
            h.remove()
    np_dtype = np.float64 if model.dtype == torch.float64 else np.float32
    pre = {k: v.numpy().astype(np_dtype) for k, v in rec.rows.items()}
    return RunResult(pre, {}, np.zeros((len(tokens), 0), np_dtype), np.zeros((0, 0), np_dtype))


def run(model, arch, tokens: list[int], decode_tokens: list[int]) -> RunResult:
    """Prefill `tokens` in one forward call, then feed `decode_tokens` one at a time through transformers'
    KV cache (DynamicCache), recording every stage of every call (`arch`: a StageMap or a name for stage_map())."""
    global _RECORDER
    smap = stage_map(arch)
    cfg = model.config
    n_q = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_q  # GPT2Config has none (no GQA)
    recs: list[Recorder] = []
    handles = attach(model, smap, lambda: _RECORDER)
    from_output = smap.has("logits_result")
    logits_id = next((s.id for s in smap.stages if s.hook == "logits_result" or s.module == "lm_head"), "logits")

    def logits_of(out) -> None:
        # the model's output logits: recorded as `logits` where the stage map says so (gemma2: after the final
        # soft-capping); elsewhere the lm_head hook's `logits` must be them, bit for bit
        if from_output:
            _RECORDER.put(logits_id, out.logits[0])
        elif not torch.equal(_RECORDER.rows[logits_id], out.logits[0].reshape(_RECORDER.rows[logits_id].shape)):
            raise AssertionError("lm_head's output is not the model's output logits")

    try:
        with torch.no_grad():
            _RECORDER = Recorder(smap, n_q, n_kv)
            recs.append(_RECORDER)
            out = model(input_ids=torch.tensor([tokens]), use_cache=True)
            logits_of(out)
            cache = out.past_key_values
            for t in decode_tokens:
                _RECORDER = Recorder(smap, n_q, n_kv)
                recs.append(_RECORDER)
                out = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
                logits_of(out)
                cache = out.past_key_values
    finally:
        _RECORDER = None
        for h in handles:
            h.remove()
    np_dtype = np.float64 if model.dtype == torch.float64 else np.float32
    pre = {k: v.numpy().astype(np_dtype) for k, v in recs[0].rows.items()}
    ids = list(pre)
    dec = {k: np.concatenate([r.rows[k].numpy() for r in recs[1:]], axis=0).astype(np_dtype) for k in ids} if decode_tokens else {}
    logits = pre.pop(logits_id)
    dlog = dec.pop(logits_id) if decode_tokens else np.zeros((0, logits.shape[1]), np_dtype)
    res = RunResult(pre, dec, logits, dlog, dict(recs[0].masks), [dict(r.attn_args) for r in recs])
    res.attn_in = [{l: (q.numpy().astype(np_dtype), k.numpy().astype(np_dtype)) for l, (q, k) in r.attn_in.items()}
                   for r in recs]
    if from_output:
        res.lm_head_logits = recs[0].lm_head.numpy().astype(np_dtype)
        res.lm_head_decode_logits = (
            np.concatenate([r.lm_head.numpy() for r in recs[1:]], axis=0).astype(np_dtype) if decode_tokens
            else np.zeros((0, logits.shape[1]), np_dtype)
        )
    return res


def versions() -> dict:
    import gguf

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gguf": getattr(gguf, "__version__", None) or __import__("importlib.metadata").metadata.version("gguf"),
        "numpy": np.__version__,
    }
