"""Write the tiny seeded Whisper HF checkpoint lockstep's whisper architecture is held to (issue 44). Runs with
the transformers oracle's venv:

    ~/.cache/lockstep/oracle-transformers/venv/bin/python oracles/whisper/make_checkpoint.py \
        --seed 1 --out oracles/whisper/checkpoints/whisper-seeded

It writes config.json (`CONFIG` below: d_model 64, 2 encoder + 2 decoder layers, 80 mel bins, 1 s of audio =
100 mel frames = 50 encoder positions), model.safetensors (every tensor float32, seeded), tokenizer.json (the
byte-level BPE of oracles/porter/make_checkpoint.py with Whisper's control tokens first:
<|endoftext|>, <|startoftranscript|>, <|en|>, <|transcribe|>, <|translate|>, <|notimestamps|>) and
preprocessor_config.json (`WhisperFeatureExtractor(feature_size=80, chunk_length=1)`), then prints the
directory digest (harness/src/hash.rs `sha256_hf_dir`).

Weights: every parameter is drawn again from a generator seeded with `--seed`: matrices and convolution
kernels N(0, 1/fan_in), biases N(0, 0.1^2), LayerNorm weights 1 + N(0, 0.1^2) and biases N(0, 0.1^2), the
token embedding (tied to the output head) N(0, 0.5^2) and the decoder positions N(0, 2^2). The encoder's
`embed_positions` keeps transformers' sinusoids (`WhisperPreTrainedModel._init_weights` → `sinusoids`),
checked here. The script checks the result is not degenerate (greedy decoding of a tone gives at least 3
distinct tokens in 6 steps, the softmax is not flat) and exits 1 otherwise.
"""

import argparse
import math
import os
import sys

import importlib.util  # noqa: E402

# the porter's byte-level BPE pieces and directory digest (oracles/porter/make_checkpoint.py)
_spec = importlib.util.spec_from_file_location(
    "porter_make_checkpoint",
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "porter", "make_checkpoint.py"),
)
_porter = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_porter)

SPECIALS = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|en|>",
    "<|transcribe|>",
    "<|translate|>",
    "<|notimestamps|>",
]
# the decoder prompt of an English transcription without timestamps
PROMPT = ["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"]

# scales of the decoder's token and position tables (large enough that greedy decoding moves on)
EMBED_STD = 0.5
POS_STD = 2.0
N_MELS = 80
CHUNK_SECONDS = 1
CONFIG = dict(
    d_model=64,
    encoder_layers=2,
    encoder_attention_heads=4,
    encoder_ffn_dim=128,
    decoder_layers=2,
    decoder_attention_heads=4,
    decoder_ffn_dim=128,
    num_mel_bins=N_MELS,
    max_source_positions=CHUNK_SECONDS * 100 // 2,
    max_target_positions=64,
    activation_function="gelu",
    scale_embedding=False,
    tie_word_embeddings=True,
    begin_suppress_tokens=None,
    suppress_tokens=None,
)


def build_tokenizer():
    """Byte-level BPE: ids 0..5 Whisper's control tokens, 6..261 the byte tokens in byte order, then one per
    merge (the porter's builder, oracles/porter/make_checkpoint.py, with Whisper's control tokens)."""
    return _porter.build_tokenizer(SPECIALS)


def feature_extractor():
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor(feature_size=N_MELS, sampling_rate=16000, hop_length=160,
                                   chunk_length=CHUNK_SECONDS, n_fft=400)


def init_weights(model, seed):
    """Draw every parameter again (scales in the module docstring); the encoder positions stay sinusoids."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            r = lambda: torch.randn(p.shape, generator=g)  # noqa: E731
            if name == "model.encoder.embed_positions.weight":
                continue
            if "layer_norm" in name and name.endswith(".weight"):
                p.copy_(1.0 + 0.1 * r())
            elif name.endswith(".bias"):
                p.copy_(0.1 * r())
            elif name == "model.decoder.embed_tokens.weight":
                p.copy_(EMBED_STD * r())
            elif name == "model.decoder.embed_positions.weight":
                p.copy_(POS_STD * r())
            elif p.ndim in (2, 3):
                fan_in = p.shape[1] * (p.shape[2] if p.ndim == 3 else 1)
                p.copy_(r() / math.sqrt(fan_in))
            else:
                raise SystemExit(f"make_checkpoint: no init rule for parameter {name} {tuple(p.shape)}")


def check(model, tok):
    """Encoder positions are the sinusoids; greedy decoding from the prompt over a tone is not degenerate."""
    import numpy as np
    import torch
    from transformers.models.whisper.modeling_whisper import sinusoids

    pos = model.model.encoder.embed_positions.weight
    if not torch.equal(pos, sinusoids(*pos.shape).to(pos.dtype)):
        raise SystemExit("make_checkpoint: encoder embed_positions are not transformers' sinusoids")
    t = np.arange(16000 * CHUNK_SECONDS) / 16000.0
    audio = (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    feats = feature_extractor()(audio, sampling_rate=16000, return_tensors="pt").input_features
    ids = [tok.token_to_id(s) for s in PROMPT]
    with torch.no_grad():
        for _ in range(6):
            out = model(input_features=feats, decoder_input_ids=torch.tensor([ids]))
            ids.append(int(out.logits[0, -1].argmax()))
    greedy = ids[len(PROMPT):]
    print(f"check: greedy {greedy}", file=sys.stderr)
    if len(set(greedy)) < 3:
        raise SystemExit(f"make_checkpoint: degenerate: greedy decoding of a tone gives {greedy}")
    logits = out.logits[0].double()
    p = torch.softmax(logits, -1)
    top1 = logits.argmax(-1).tolist()
    v = logits.shape[-1]
    print(f"check: top-1 over the prompt {top1}, logits std {logits.std().item():.2f}, max prob mean "
          f"{p.max(-1).values.mean().item():.3f} (uniform {1 / v:.4f})", file=sys.stderr)
    if len(set(top1)) < 2:
        raise SystemExit(f"make_checkpoint: degenerate: top-1 over the prompt is {top1}")
    if p.max(-1).values.mean().item() < 5.0 / v:
        raise SystemExit("make_checkpoint: degenerate: the softmax is nearly flat")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--out", required=True, help="directory to write (created; existing files replaced)")
    ap.add_argument("--ffn-dim", type=int, default=CONFIG["encoder_ffn_dim"],
                    help="encoder and decoder FFN width (default 128, the committed checkpoint's; whisper.cpp "
                         "holds only 4 x d_model = 256: oracles/whisper/whispercpp/)")
    a = ap.parse_args()

    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    torch.manual_seed(a.seed)
    tok = build_tokenizer()
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    cfg = WhisperConfig(
        vocab_size=tok.get_vocab_size(),
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|endoftext|>"],
        pad_token_id=ids["<|endoftext|>"],
        decoder_start_token_id=ids["<|startoftranscript|>"],
        **{**CONFIG, "encoder_ffn_dim": a.ffn_dim, "decoder_ffn_dim": a.ffn_dim},
    )
    model = WhisperForConditionalGeneration(cfg).to(torch.float32).eval()
    init_weights(model, a.seed)
    check(model, tok)

    _porter.save_checkpoint(model, tok, a.out, extra=[feature_extractor()])


if __name__ == "__main__":
    main()
