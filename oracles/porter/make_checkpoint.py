"""Write a tiny seeded HF checkpoint of an architecture lockstep's engine does not implement: the porter's
fixture (issue 43). Runs with the transformers oracle's venv:

    ~/.cache/lockstep/oracle-transformers/venv/bin/python oracles/porter/make_checkpoint.py \
        --arch olmo2 --seed 1 --out oracles/porter/checkpoints/porter-olmo2

It writes config.json (the committed small config of the architecture, `CONFIGS` below, with the
tokenizer's vocabulary size and control-token ids), model.safetensors (every tensor float32, seeded) and
tokenizer.json (a byte-level BPE like lockstep's seeded GGUF models, engine/src/synth.rs `SynthModel::vocab`:
3 control tokens, the 256 GPT-2 byte tokens, then a few merges), and prints the directory digest
(harness/src/hash.rs `sha256_hf_dir`) for the `[[checkpoints]]` entry of models.toml.

Weights: transformers' own init (`initializer_range` 0.02) gives near-uniform logits on a 64-wide model, so
every tensor is drawn again from a seeded torch generator at scales that keep the forward pass realistic:
matrices N(0, 1/fan_in) (unit-gain projections), embeddings N(0, 1), norm weights 1 + N(0, 0.1^2), the output
head N(0, (2.5 / sqrt(d))^2) so that logits spread over a few units. The script checks the result is not
degenerate (top-1 not constant over a prompt, softmax not flat) and exits 1 otherwise.

Architectures (the transformers classes are the reference):
- olmo2 (`Olmo2ForCausalLM`): no pre-norms; RMSNorm after attention and after the FFN, before each residual
  add; Q/K RMSNorm over the whole projection (all heads at once), before RoPE.
- granite (`GraniteForCausalLM`): a Llama with four multipliers: embeddings × `embedding_multiplier`,
  each residual branch × `residual_multiplier`, attention scores × `attention_multiplier` (instead of
  1/sqrt(head_dim)), logits ÷ `logits_scaling`.
"""

import argparse
import hashlib
import json
import os
import sys

# tokens of lockstep's seeded vocabulary (engine/src/synth.rs TINY_SPECIALS, TINY_MERGES), with a few more
# merges so English prompts exercise the BPE
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "t"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("o", "n")]

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    attention_bias=False,
)

# the committed small config of each architecture (vocab_size and token ids come from the tokenizer)
CONFIGS = {
    "olmo2": dict(COMMON),
    "granite": dict(
        COMMON,
        embedding_multiplier=4.0,
        residual_multiplier=0.5,
        attention_multiplier=0.125,
        logits_scaling=2.0,
    ),
}

CLASSES = {"olmo2": ("Olmo2Config", "Olmo2ForCausalLM"), "granite": ("GraniteConfig", "GraniteForCausalLM")}

# a prompt for the degeneracy check
CHECK_PROMPT = "the hell is here, in the other one"


def bytes_to_unicode():
    """GPT-2's printable form of each byte (openai/gpt-2 encoder.py `bytes_to_unicode`)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def build_tokenizer(specials=None):
    """The byte-level BPE: ids 0..n-1 the control tokens (`specials`, default SPECIALS), then the byte tokens
    in byte order, then one per merge. oracles/whisper/make_checkpoint.py builds its tokenizer here too."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    specials = SPECIALS if specials is None else specials
    vocab = {s: i for i, s in enumerate(specials)}
    table = bytes_to_unicode()
    for b in range(256):
        vocab[table[b]] = len(vocab)
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=list(MERGES)))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def init_weights(model, seed):
    """Draw every parameter again from a generator seeded with `seed` (scales in the module docstring)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    d = model.config.hidden_size
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif name.startswith("lm_head"):
                p.copy_(torch.randn(p.shape, generator=g) * (2.5 / d**0.5))
            elif p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
            else:
                raise SystemExit(f"make_checkpoint: no init rule for parameter {name} {tuple(p.shape)}")


def dir_digest(out):
    """harness/src/hash.rs `sha256_hf_dir`: sha256 of one line "<sha256 hex>  <file name>\\n" per file
    (config.json, tokenizer.json, model.safetensors.index.json if present, every *.safetensors), sorted by
    name."""
    names = sorted(
        n for n in os.listdir(out)
        if n in ("config.json", "tokenizer.json", "model.safetensors.index.json") or n.endswith(".safetensors")
    )
    text = ""
    for n in names:
        with open(os.path.join(out, n), "rb") as f:
            text += f"{hashlib.sha256(f.read()).hexdigest()}  {n}\n"
    return hashlib.sha256(text.encode()).hexdigest()


def check_not_degenerate(model, tok):
    """Top-1 over the check prompt is not one token; the softmax is not flat (max prob well above 1/V)."""
    import torch

    ids = torch.tensor([tok.encode(CHECK_PROMPT).ids])
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    top1 = logits.argmax(-1).tolist()
    p = torch.softmax(logits, -1)
    pmax = p.max(-1).values
    v = logits.shape[-1]
    ent = -(p * p.clamp_min(1e-30).log()).sum(-1)
    print(
        f"check: {len(top1)} positions, {len(set(top1))} distinct top-1, logits std {logits.std().item():.2f}, "
        f"max prob mean {pmax.mean().item():.3f} (uniform {1 / v:.4f}), entropy mean {ent.mean().item():.2f} "
        f"(uniform {torch.log(torch.tensor(float(v))).item():.2f})",
        file=sys.stderr,
    )
    if len(set(top1)) < 3:
        raise SystemExit(f"make_checkpoint: degenerate: top-1 over the check prompt is {top1}")
    if pmax.mean().item() < 10.0 / v:
        raise SystemExit("make_checkpoint: degenerate: the softmax is nearly flat")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", required=True, choices=sorted(CONFIGS))
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True, help="directory to write (created; existing files replaced)")
    a = ap.parse_args()

    import torch
    import transformers

    torch.manual_seed(a.seed)
    tok = build_tokenizer()
    cfg_cls, model_cls = (getattr(transformers, n) for n in CLASSES[a.arch])
    cfg = cfg_cls(
        vocab_size=tok.get_vocab_size(),
        bos_token_id=None,
        eos_token_id=0,
        pad_token_id=0,
        **CONFIGS[a.arch],
    )
    model = model_cls(cfg).to(torch.float32).eval()
    init_weights(model, a.seed)
    check_not_degenerate(model, tok)

    save_checkpoint(model, tok, a.out)


def save_checkpoint(model, tok, out, extra=()):
    """Write the checkpoint directory (safetensors, config.json, tokenizer.json, then each of `extra`'s
    `save_pretrained(out)`, e.g. a feature extractor) and print its size and registry digest as one JSON
    line. oracles/whisper/make_checkpoint.py saves through here too."""
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save(os.path.join(out, "tokenizer.json"))
    for e in extra:
        e.save_pretrained(out)
    # save_pretrained writes generation_config.json too: not part of the checkpoint the registry pins
    gen = os.path.join(out, "generation_config.json")
    if os.path.exists(gen):
        os.remove(gen)
    total = sum(os.path.getsize(os.path.join(out, n)) for n in os.listdir(out))
    print(json.dumps({"arch": model.config.model_type, "out": out, "bytes": total, "sha256": dir_digest(out)}))


if __name__ == "__main__":
    main()
