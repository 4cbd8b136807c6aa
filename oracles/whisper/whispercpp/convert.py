"""Write a Hugging Face Whisper checkpoint (config.json, model.safetensors, tokenizer.json,
preprocessor_config.json) as a whisper.cpp model file (its own binary format, not GGUF), ftype 1: the
convolution kernels and every weight matrix (attention, cross-attention, MLP, token embedding) float16, the
rest float32 — the only form this whisper.cpp runs: with ftype 0 (float32) its loader makes the convolution
kernels float32, and `ggml_conv_1d` (im2col into float16) then aborts (`GGML_ASSERT(src0->type ==
GGML_TYPE_F16)`, ggml-cpu/ops.cpp). So that transformers and whisper.cpp hold exactly the same weights,
`--rounded-hf-out` also writes the checkpoint with those tensors rounded to float16 (stored as float32): make
the transformers goldens from that copy. Runs with the transformers oracle's venv:

    ~/.cache/lockstep/oracle-transformers/venv/bin/python oracles/whisper/whispercpp/convert.py \
        --hf-dir DIR --out model.bin --rounded-hf-out DIR16

The format is what `whisper_model_load` (whisper.cpp/src/whisper.cpp, the pinned pywhispercpp 1.5.0 sdist)
reads, little-endian throughout:
- magic `0x67676d6c` ("ggml"), then eleven int32 hparams: n_vocab, n_audio_ctx, n_audio_state, n_audio_head,
  n_audio_layer, n_text_ctx, n_text_state, n_text_head, n_text_layer, n_mels, ftype;
- the mel filter bank: int32 n_mel, int32 n_fft (= n_fft/2 + 1 frequency bins), then n_mel x n_fft float32
  (row j = mel band j): `WhisperFeatureExtractor.mel_filters` transposed (slaney, as the extractor uses them);
- the vocabulary: int32 count, then per token int32 length + bytes (byte-level BPE pieces mapped back to bytes);
- per tensor: int32 n_dims, int32 name length, int32 type (0 = f32, 1 = f16), int32 ne[n_dims] (ggml order: the numpy
  shape reversed), the name, then the data (no padding). Names are openai-whisper's (`encoder.blocks.0.attn.query
  .weight`, ...: whisper.cpp/src/whisper-arch.h); convolution biases become [n_state, 1].

whisper.cpp builds its feed-forward layers as 4 x n_state wide (`whisper_model_load`), so a checkpoint whose
`encoder_ffn_dim`/`decoder_ffn_dim` is not 4 x d_model cannot be held: refused with that reason (lockstep's
committed whisper-seeded has 2 x; `make_checkpoint.py --ffn-dim 256` makes one whisper.cpp can load).
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

MAGIC = 0x67676D6C
FTYPE_F16 = 1  # GGML_FTYPE_MOSTLY_F16
TYPE_F32, TYPE_F16 = 0, 1


def stored_f16(oname):
    """True for the tensors whisper.cpp's loader makes float16 in an ftype-1 file (`wtype`/`vtype` in
    `whisper_model_load`): the convolution kernels, the token embedding and every attention/MLP matrix."""
    if oname in ("encoder.conv1.weight", "encoder.conv2.weight", "decoder.token_embedding.weight"):
        return True
    return ".blocks." in oname and oname.endswith(".weight") and ("attn." in oname or ".mlp." in oname)


def bytes_to_unicode():
    """GPT-2's byte <-> printable character table: the porter's (oracles/porter/make_checkpoint.py), whose
    byte-level BPE the seeded Whisper's tokenizer is."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "porter", "make_checkpoint.py")
    spec = importlib.util.spec_from_file_location("porter_make_checkpoint", path)
    porter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(porter)
    return porter.bytes_to_unicode()


def hf_to_openai(name):
    """The openai-whisper tensor name whisper.cpp reads for a transformers `WhisperForConditionalGeneration`
    parameter, or None for one it does not store (`proj_out.weight`: tied to the token embedding)."""
    if name == "proj_out.weight":
        return None
    n = name.removeprefix("model.")
    for a, b in [
        ("encoder.embed_positions.weight", "encoder.positional_embedding"),
        ("decoder.embed_positions.weight", "decoder.positional_embedding"),
        ("decoder.embed_tokens.weight", "decoder.token_embedding.weight"),
        ("encoder.layer_norm.", "encoder.ln_post."),
        ("decoder.layer_norm.", "decoder.ln."),
        (".layers.", ".blocks."),
        (".self_attn_layer_norm.", ".attn_ln."),
        (".encoder_attn_layer_norm.", ".cross_attn_ln."),
        (".final_layer_norm.", ".mlp_ln."),
        (".self_attn.", ".attn."),
        (".encoder_attn.", ".cross_attn."),
        (".q_proj.", ".query."),
        (".k_proj.", ".key."),
        (".v_proj.", ".value."),
        (".out_proj.", ".out."),
        (".fc1.", ".mlp.0."),
        (".fc2.", ".mlp.2."),
    ]:
        n = n.replace(a, b)
    return n


def convert(hf_dir, out, rounded_hf_out=None):
    from safetensors.numpy import load_file
    from transformers import WhisperFeatureExtractor

    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    d = cfg["d_model"]
    for k in ("encoder_ffn_dim", "decoder_ffn_dim"):
        if cfg[k] != 4 * d:
            raise SystemExit(f"convert: {hf_dir}/config.json has {k} = {cfg[k]}, but whisper.cpp builds its "
                             f"feed-forward layers 4 x d_model = {4 * d} wide (whisper_model_load): this "
                             "checkpoint cannot be held to whisper.cpp (make_checkpoint.py --ffn-dim 256)")
    if cfg["encoder_attention_heads"] <= 0 or cfg["decoder_attention_heads"] <= 0:
        raise SystemExit(f"convert: {hf_dir}/config.json: attention heads must be positive")
    tensors = load_file(os.path.join(hf_dir, "model.safetensors"))
    fe = WhisperFeatureExtractor.from_pretrained(hf_dir)
    filters = np.ascontiguousarray(fe.mel_filters.T.astype(np.float32))  # [n_mel, n_fft/2+1]
    tok = json.load(open(os.path.join(hf_dir, "tokenizer.json")))
    vocab = {**tok["model"]["vocab"], **{t["content"]: t["id"] for t in tok.get("added_tokens", [])}}
    n_vocab = cfg["vocab_size"]
    by_id = {i: t for t, i in vocab.items()}
    dec = {c: b for b, c in bytes_to_unicode().items()}
    special = {t["content"] for t in tok.get("added_tokens", [])}

    def piece(i):
        t = by_id.get(i, "")
        if t in special:
            return t.encode()
        return bytes(dec[c] for c in t) if all(c in dec for c in t) else t.encode()

    rounded = {}
    tmp = out + ".part"
    with open(tmp, "wb") as f:
        w = lambda fmt, *v: f.write(struct.pack("<" + fmt, *v))  # noqa: E731
        w("I", MAGIC)
        w("11i", n_vocab, cfg["max_source_positions"], d, cfg["encoder_attention_heads"], cfg["encoder_layers"],
          cfg["max_target_positions"], d, cfg["decoder_attention_heads"], cfg["decoder_layers"],
          cfg["num_mel_bins"], FTYPE_F16)
        w("2i", *filters.shape)
        f.write(filters.tobytes())
        w("i", n_vocab)
        for i in range(n_vocab):
            b = piece(i)
            w("I", len(b))
            f.write(b)
        n = 0
        for name in sorted(tensors):
            oname = hf_to_openai(name)
            if oname is None:
                continue
            a = tensors[name].astype(np.float32)
            if oname in ("encoder.conv1.bias", "encoder.conv2.bias"):
                a = a.reshape(-1, 1)
            ty = TYPE_F16 if stored_f16(oname) else TYPE_F32
            a = np.ascontiguousarray(a.astype(np.float16) if ty == TYPE_F16 else a)
            if ty == TYPE_F16:
                rounded[name] = a.astype(np.float32)
            nb = oname.encode()
            w("3i", a.ndim, len(nb), ty)
            w(f"{a.ndim}i", *reversed(a.shape))
            f.write(nb)
            f.write(a.tobytes())
            n += 1
    os.replace(tmp, out)
    print(f"convert: {out}: {n} tensors ({len(rounded)} float16), n_vocab {n_vocab}, {os.path.getsize(out)} bytes",
          file=sys.stderr)
    if rounded_hf_out:
        import shutil

        from safetensors.numpy import save_file

        os.makedirs(rounded_hf_out, exist_ok=True)
        for f in os.listdir(hf_dir):
            if f != "model.safetensors" and os.path.isfile(os.path.join(hf_dir, f)):
                shutil.copy(os.path.join(hf_dir, f), os.path.join(rounded_hf_out, f))
        save_file({k: rounded.get(k, v) for k, v in tensors.items()},
                  os.path.join(rounded_hf_out, "model.safetensors"), metadata={"format": "pt"})
        print(f"convert: {rounded_hf_out}: the checkpoint with whisper.cpp's float16 tensors rounded", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounded-hf-out", help="also write the checkpoint with the float16 tensors rounded here")
    a = ap.parse_args()
    convert(a.hf_dir, a.out, a.rounded_hf_out)


if __name__ == "__main__":
    main()
