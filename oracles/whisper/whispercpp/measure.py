"""Hold whisper.cpp (the second oracle of lockstep's whisper architecture, issue 44) to transformers' goldens at
the logits: for every golden of a transformers golden directory (oracles/whisper/make_goldens.py), run the same
weights through whisper.cpp's C API (libwhisper.so from build.sh, through ctypes) — the log-mel, the encoder,
the decoder prompt of control tokens, then each teacher-forced decode step through its own KV cache — and
compare its logits with transformers' f32 logits. Runs with the transformers oracle's venv:

    ~/.cache/lockstep/oracle-transformers/venv/bin/python oracles/whisper/whispercpp/measure.py \
        --lib "$(oracles/whisper/whispercpp/build.sh)" --model model.bin --golden-dir DIR [--json OUT]

whisper.cpp's C API (whisper.h) exposes no per-stage callback, so this oracle is held at the logits
(`whisper_get_logits`: the row of the last token of each `whisper_decode` — whisper.cpp's batch asks logits of
the last token only, the other rows are left as they were — so the rows compared are the prompt's last
position and every decode step). Each golden runs in three settings:
- `hf-mel`: transformers' log-mel (the golden's `mel`) through `whisper_set_mel`, flash attention off;
- `own-mel`: whisper.cpp's own log-mel of the golden's WAV (`whisper_pcm_to_mel`: its FFT, the filters in the
  model file, 30 s of zero padding), flash attention off;
- `hf-mel+fa`, `own-mel+fa`: the same with flash attention on (`whisper_context_params.flash_attn`, whisper.cpp's
  default): what a whisper.cpp user gets.

Per setting and golden, over the prompt positions and the decode steps: top-1 agreement with transformers,
max and mean KL(P_transformers || P_whisper.cpp) in nats, the logits' max abs error and NMSE, beside the golden's
f32 floor (`floor.logits`: f32 against f64 in transformers). Exit 1 if whisper.cpp fails to load or run.
"""

import argparse
import ctypes as C
import json
import os
import sys
import wave

import numpy as np


class Aheads(C.Structure):
    _fields_ = [("n_heads", C.c_size_t), ("heads", C.c_void_p)]


class ContextParams(C.Structure):
    """`struct whisper_context_params` (whisper.h, pywhispercpp 1.5.0's whisper.cpp)."""

    _fields_ = [
        ("use_gpu", C.c_bool),
        ("flash_attn", C.c_bool),
        ("gpu_device", C.c_int),
        ("dtw_token_timestamps", C.c_bool),
        ("dtw_aheads_preset", C.c_int),
        ("dtw_n_top", C.c_int),
        ("dtw_aheads", Aheads),
        ("dtw_mem_size", C.c_size_t),
    ]


LOG_CB = C.CFUNCTYPE(None, C.c_int, C.c_char_p, C.c_void_p)
_quiet = LOG_CB(lambda level, text, ud: None)


def load_lib(lib_dir):
    """libwhisper.so with its ggml libraries loaded first (global symbols, no rpath needed)."""
    for name in ("libggml-base.so", "libggml-cpu.so", "libggml.so"):
        C.CDLL(os.path.join(lib_dir, name), mode=C.RTLD_GLOBAL)
    w = C.CDLL(os.path.join(lib_dir, "libwhisper.so"))
    w.whisper_context_default_params_by_ref.restype = C.POINTER(ContextParams)
    w.whisper_init_from_file_with_params.restype = C.c_void_p
    w.whisper_init_from_file_with_params.argtypes = [C.c_char_p, ContextParams]
    w.whisper_set_mel.argtypes = [C.c_void_p, C.POINTER(C.c_float), C.c_int, C.c_int]
    w.whisper_pcm_to_mel.argtypes = [C.c_void_p, C.POINTER(C.c_float), C.c_int, C.c_int]
    w.whisper_encode.argtypes = [C.c_void_p, C.c_int, C.c_int]
    w.whisper_decode.argtypes = [C.c_void_p, C.POINTER(C.c_int32), C.c_int, C.c_int, C.c_int]
    w.whisper_get_logits.restype = C.POINTER(C.c_float)
    w.whisper_get_logits.argtypes = [C.c_void_p]
    w.whisper_n_vocab.argtypes = [C.c_void_p]
    w.whisper_free.argtypes = [C.c_void_p]
    w.whisper_log_set.argtypes = [LOG_CB, C.c_void_p]
    w.whisper_log_set(_quiet, None)
    return w


def read_wav(path):
    with wave.open(path, "rb") as f:
        if f.getnchannels() != 1 or f.getsampwidth() != 2 or f.getframerate() != 16000:
            raise SystemExit(f"measure: {path}: not 16 kHz mono 16-bit PCM")
        pcm = np.frombuffer(f.readframes(f.getnframes()), dtype="<i2")
    return (pcm.astype(np.float32) / 32768.0).astype(np.float32)


def run(w, model, mel, wav, tokens, decode_tokens, flash_attn, threads):
    """whisper.cpp's logits [1 + len(decode_tokens), n_vocab]: the prompt's last position (the prompt in one
    `whisper_decode`), then one row per decode step (n_past growing); the encoder fed `mel` ([frames, n_mel])
    or, when `mel` is None, whisper.cpp's own log-mel of `wav`."""
    p = w.whisper_context_default_params_by_ref().contents
    p.use_gpu = False
    p.flash_attn = flash_attn
    ctx = w.whisper_init_from_file_with_params(model.encode(), p)
    if not ctx:
        raise SystemExit(f"measure: whisper.cpp could not load {model}")
    try:
        if mel is None:
            s = np.ascontiguousarray(wav, dtype=np.float32)
            rc = w.whisper_pcm_to_mel(ctx, s.ctypes.data_as(C.POINTER(C.c_float)), len(s), threads)
        else:
            m = np.ascontiguousarray(mel.T, dtype=np.float32)  # whisper.cpp holds the mel [n_mel][n_len]
            rc = w.whisper_set_mel(ctx, m.ctypes.data_as(C.POINTER(C.c_float)), m.shape[1], m.shape[0])
        if rc != 0 or w.whisper_encode(ctx, 0, threads) != 0:
            raise SystemExit(f"measure: whisper.cpp failed on the mel or the encoder (rc {rc})")
        n_vocab = w.whisper_n_vocab(ctx)
        rows = []
        steps = [list(tokens)] + [[t] for t in decode_tokens]
        n_past = 0
        for toks in steps:
            a = (C.c_int32 * len(toks))(*toks)
            if w.whisper_decode(ctx, a, len(toks), n_past, threads) != 0:
                raise SystemExit(f"measure: whisper_decode failed at n_past {n_past}")
            out = np.ctypeslib.as_array(w.whisper_get_logits(ctx), shape=(len(toks) * n_vocab,))
            rows.append(out.reshape(len(toks), n_vocab)[-1:].copy())
            n_past += len(toks)
        return np.concatenate(rows)
    finally:
        w.whisper_free(ctx)


def log_softmax(x):
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def compare(ref, got):
    lp, lq = log_softmax(ref), log_softmax(got)
    kl = (np.exp(lp) * (lp - lq)).sum(-1)
    err = got.astype(np.float64) - ref
    return {
        "rows": int(ref.shape[0]),
        "top1_agree": int((ref.argmax(-1) == got.argmax(-1)).sum()),
        "kl_max": float(kl.max()),
        "kl_mean": float(kl.mean()),
        "max_abs": float(np.abs(err).max()),
        "nmse": float((err ** 2).sum() / (ref.astype(np.float64) ** 2).sum()),
    }


SETTINGS = [("hf-mel", True, False), ("own-mel", False, False), ("hf-mel+fa", True, True), ("own-mel+fa", False, True)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", required=True, help="the directory build.sh prints (libwhisper.so + ggml)")
    ap.add_argument("--model", required=True, help="the whisper.cpp model file (convert.py)")
    ap.add_argument("--golden-dir", required=True, help="a make_goldens.py directory (transformers-f32/, audio/)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()

    w = load_lib(a.lib)
    gdir = os.path.join(a.golden_dir, "transformers-f32")
    names = sorted(f[:-4] for f in os.listdir(gdir) if f.endswith(".npz"))
    if not names:
        raise SystemExit(f"measure: no goldens in {gdir}")
    results = []
    print("| golden | setting | top-1 agree | KL max (nats) | KL mean | max abs | NMSE | f32 floor NMSE |")
    print("|---|---|--:|--:|--:|--:|--:|--:|")
    for name in names:
        z = np.load(os.path.join(gdir, name + ".npz"))
        ref = np.concatenate([z["logits"][-1:], z["decode.logits"]])
        floor = float(max(z["floor.logits"][0], z["floor.decode.logits"][0]))
        wav = read_wav(os.path.join(a.golden_dir, "audio", name + ".wav"))
        for setting, hf_mel, fa in SETTINGS:
            got = run(w, a.model, z["mel"] if hf_mel else None, wav, z["tokens"].tolist(),
                      z["decode.tokens"].tolist(), fa, a.threads)
            if got.shape != ref.shape:
                raise SystemExit(f"measure: {name}: whisper.cpp gave logits {got.shape}, golden {ref.shape}")
            r = {"golden": name, "setting": setting, "f32_floor_nmse": floor, **compare(ref, got)}
            results.append(r)
            print(f"| {name} | {setting} | {r['top1_agree']}/{r['rows']} | {r['kl_max']:.3g} | {r['kl_mean']:.3g} "
                  f"| {r['max_abs']:.3g} | {r['nmse']:.3g} | {floor:.2g} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"model": a.model, "golden_dir": a.golden_dir, "results": results}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
