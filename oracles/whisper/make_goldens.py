"""Transformers goldens of the seeded Whisper checkpoint (issue 44): the committed WAVs (made here,
deterministically, when --make-audio is given), `WhisperFeatureExtractor`'s log-mel, and every stage of
`WhisperForConditionalGeneration` captured by forward hooks (`STAGES` below: module path + hook kind ->
lockstep's canonical stage id), for the decoder prompt <|startoftranscript|> <|en|> <|transcribe|>
<|notimestamps|> and then `--n-decode` greedy steps through the model's cache (each step feeds the previous
step's argmax: the engine, teacher-forced with the same tokens, must reproduce every step). Runs with the
transformers oracle's venv:

    ~/.cache/lockstep/oracle-transformers/venv/bin/python oracles/whisper/make_goldens.py --make-audio

Writes golden/whisper-seeded/manifest.json (sha256 of every file below), golden/whisper-seeded/audio/<name>.wav (16 kHz mono 16-bit PCM, 1 s each) and
golden/whisper-seeded/transformers-f32/<name>.npz with, per stage id, `[rows, width]` float32:
- `mel` (the transpose of `input_features[0]`: one row per frame), every `enc.*` stage (rows are encoder
  positions), `blk.N.cross_k` / `blk.N.cross_v` (computed once, rows are encoder positions);
- the prompt's decoder stages under their ids (rows are the prompt positions), and each decode step's
  under `decode.<id>` (one row per step, in order);
- `tokens` (the prompt), `decode.tokens` (the fed tokens of the decode steps), `greedy.tokens` (the argmax
  of the prompt's last row and of every decode step: transformers' greedy transcription);
- `floor.<id>` (float32, shape [1]): the NMSE of this f32 stage against the same forward in float64 (the f32
  floor: what f32 rounding alone costs at that stage); `floor.mel`: the feature extractor's float32
  spectrogram against the same route in float64 (`mel_f64`).

`enc.conv1` / `enc.conv2` are `gelu(conv(x))`: WhisperEncoder.forward applies `nn.functional.gelu` outside any
module, so the hook applies the same function to the convolution's output (`enc.conv1` is also conv2's
input). The model runs with `attn_implementation="eager"`.
"""

import argparse
import os
import sys
import wave

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
from make_checkpoint import PROMPT, feature_extractor  # noqa: E402  (oracles/whisper/make_checkpoint.py)

SR = 16000


def make_audio():
    """The committed inputs, 1 s each, deterministic: name -> float samples in [-1, 1]."""
    t = np.arange(SR) / SR
    rng = np.random.default_rng(44)
    chirp_phase = 2 * np.pi * (100.0 * t + 0.5 * (4000.0 - 100.0) * t * t)
    burst = np.where((t > 0.3) & (t < 0.7), 0.6 * np.sin(2 * np.pi * 1000.0 * t), 0.0)
    return {
        "tones": 0.4 * np.sin(2 * np.pi * 440.0 * t) + 0.2 * np.sin(2 * np.pi * 1250.0 * t),
        "chirp": 0.5 * np.sin(chirp_phase),
        "noise": 0.1 * rng.standard_normal(SR),
        "burst": burst,
    }


SPEECH_TEXT = "Hello world."
SPEECH_VOICE = ["-v", "en-us", "-s", "190"]  # eSpeak NG 1.51 (Debian's espeak-ng): 0.94 s at 22050 Hz


def make_speech():
    """A spoken sentence (`SPEECH_TEXT`) from eSpeak NG if it is on PATH (`espeak-ng -w`, 22050 Hz 16-bit
    mono), linearly resampled to 16 kHz and zero-padded to 1 s; None without it (the committed speech.wav
    stays: another eSpeak NG version may speak other samples)."""
    import shutil
    import subprocess
    import tempfile

    exe = shutil.which("espeak-ng")
    if exe is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "s.wav")
        subprocess.run([exe, *SPEECH_VOICE, "-w", path, SPEECH_TEXT], check=True)
        with wave.open(path, "rb") as w:
            rate = w.getframerate()
            assert w.getnchannels() == 1 and w.getsampwidth() == 2, path
            x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64) / 32768.0
    t = np.arange(min(SR, int(len(x) * SR / rate))) / SR
    y = np.interp(t, np.arange(len(x)) / rate, x)
    return np.concatenate([y, np.zeros(SR - len(y))])


def write_wav(path, x):
    pcm = np.clip(np.round(x * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SR)
        w.writeframes(pcm.tobytes())


def read_wav(path):
    """16-bit PCM / 32768, as lockstep's engine (engine/src/audio/wav.rs) and soundfile read it."""
    with wave.open(path, "rb") as w:
        assert w.getnchannels() == 1 and w.getframerate() == SR and w.getsampwidth() == 2, path
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0


def stage_table(n_enc, n_dec):
    """(module path, hook kind, stage id): "out" = the module's output, "in" = its first input."""
    rows = [("model.encoder.conv1", "gelu_out", "enc.conv1"), ("model.encoder.conv2", "gelu_out", "enc.conv2"),
            ("model.encoder.layers.0", "in", "enc.embed"), ("model.encoder.layer_norm", "out", "enc.output_norm"),
            ("model.decoder.layers.0", "in", "embed"), ("model.decoder.layer_norm", "out", "output_norm")]
    def block(pre, sid, cross):
        r = [(f"{pre}.self_attn_layer_norm", "out", f"{sid}.attn_norm"),
             (f"{pre}.self_attn.q_proj", "out", f"{sid}.q"),
             (f"{pre}.self_attn.k_proj", "out", f"{sid}.k"),
             (f"{pre}.self_attn.v_proj", "out", f"{sid}.v"),
             (f"{pre}.self_attn.out_proj", "in", f"{sid}.attn_out"),
             (f"{pre}.self_attn.out_proj", "out", f"{sid}.attn_proj"),
             (f"{pre}.final_layer_norm", "in", f"{sid}.ffn_inp"),
             (f"{pre}.final_layer_norm", "out", f"{sid}.ffn_norm"),
             (f"{pre}.fc1", "out", f"{sid}.ffn_up"),
             (f"{pre}.fc2", "in", f"{sid}.ffn_act"),
             (f"{pre}.fc2", "out", f"{sid}.ffn_out"),
             (pre, "out", f"{sid}.out")]
        if cross:
            r += [(f"{pre}.encoder_attn_layer_norm", "in", f"{sid}.cross_inp"),
                  (f"{pre}.encoder_attn_layer_norm", "out", f"{sid}.cross_attn_norm"),
                  (f"{pre}.encoder_attn.q_proj", "out", f"{sid}.cross_q"),
                  (f"{pre}.encoder_attn.k_proj", "out", f"{sid}.cross_k"),
                  (f"{pre}.encoder_attn.v_proj", "out", f"{sid}.cross_v"),
                  (f"{pre}.encoder_attn.out_proj", "in", f"{sid}.cross_attn_out"),
                  (f"{pre}.encoder_attn.out_proj", "out", f"{sid}.cross_attn_proj")]
        return r
    for n in range(n_enc):
        rows += block(f"model.encoder.layers.{n}", f"enc.blk.{n}", False)
    for n in range(n_dec):
        rows += block(f"model.decoder.layers.{n}", f"blk.{n}", True)
    return rows


def run(model, feats, prompt, n_decode, greedy=None):
    """One prompt forward and `n_decode` cached steps with hooks. Returns {id: [rows, width] array} (decode
    steps under `decode.<id>`), the fed decode tokens and the greedy tokens. With `greedy` given, those
    tokens are fed instead of this run's argmax (the f64 floor run follows the f32 run's path)."""
    import torch

    cap = {}
    phase = ["prefill"]
    hooks = []
    cfg = model.config
    for path, kind, sid in stage_table(cfg.encoder_layers, cfg.decoder_layers):
        mod = model.get_submodule(path)

        def hook(m, args, out, sid=sid, kind=kind):
            x = args[0] if kind == "in" else (out[0] if isinstance(out, tuple) else out)
            if kind == "gelu_out":
                x = torch.nn.functional.gelu(out).transpose(1, 2)
            x = x.detach().to(torch.float64).numpy()[0]
            x = x.reshape(x.shape[0], -1)
            key = sid if phase[0] == "prefill" or sid.startswith("enc.") or ".cross_k" in sid or ".cross_v" in sid \
                else "decode." + sid
            if key in cap and key.startswith("decode."):
                cap[key] = np.concatenate([cap[key], x])
            elif key in cap:
                raise SystemExit(f"make_goldens: stage {key} captured twice in one phase")
            else:
                cap[key] = x
        hooks.append(mod.register_forward_hook(hook))
    dt = next(model.parameters()).dtype
    with torch.no_grad():
        out = model(input_features=feats.to(dt), decoder_input_ids=torch.tensor([prompt]), use_cache=True)
        cap["logits"] = out.logits[0].to(torch.float64).numpy()
        nxt = int(out.logits[0, -1].argmax())
        got, fed = [nxt], []
        past = out.past_key_values
        enc = out.encoder_last_hidden_state
        phase[0] = "decode"
        for i in range(n_decode):
            tok = greedy[i] if greedy is not None else nxt
            fed.append(tok)
            o = model(encoder_outputs=(enc,), decoder_input_ids=torch.tensor([[tok]]), past_key_values=past,
                      use_cache=True)
            past = o.past_key_values
            lg = o.logits[0].to(torch.float64).numpy()
            cap["decode.logits"] = lg if "decode.logits" not in cap else np.concatenate([cap["decode.logits"], lg])
            nxt = int(o.logits[0, -1].argmax())
            got.append(nxt)
    for h in hooks:
        h.remove()
    return cap, fed, got


def mel_f64(fe, x):
    """The feature extractor's numpy route (`WhisperFeatureExtractor._np_extract_fbank_features`: periodic
    Hann, reflect-padded STFT, slaney filters, log10, max - 8 clamp, (x + 4) / 4) in float64 instead of its
    float32 spectrogram: the reference its own f32 rounding is measured against (`floor.mel`)."""
    from transformers.audio_utils import spectrogram, window_function

    n = fe.n_samples
    x64 = np.zeros(n)
    x64[: min(n, len(x))] = x[:n]
    log = spectrogram(x64, window_function(fe.n_fft, "hann"), frame_length=fe.n_fft, hop_length=fe.hop_length,
                      power=2.0, mel_filters=fe.mel_filters, log_mel="log10", dtype=np.float64)[:, :-1]
    log = np.maximum(log, log.max() - 8.0)
    return (log + 4.0) / 4.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hf-dir", default=os.path.join(HERE, "checkpoints", "whisper-seeded"))
    ap.add_argument("--golden-dir", default=os.path.join(ROOT, "golden", "whisper-seeded"))
    ap.add_argument("--n-decode", type=int, default=6)
    ap.add_argument("--make-audio", action="store_true", help="(re)write the WAVs first")
    ap.add_argument("--run-entries-only", action="store_true",
                    help="only (re)write the goldens' entries in golden/manifest.json from the files on disk")
    ap.add_argument("--no-run-entries", action="store_true",
                    help="goldens outside golden/ (e.g. oracles/whisper/whispercpp/measure.sh's): leave "
                         "golden/manifest.json alone")
    a = ap.parse_args()
    if a.run_entries_only:
        write_run_entries(a.golden_dir, a.hf_dir)
        return

    import torch
    from tokenizers import Tokenizer
    from transformers import WhisperForConditionalGeneration

    torch.set_num_threads(1)
    audio_dir = os.path.join(a.golden_dir, "audio")
    out_dir = os.path.join(a.golden_dir, "transformers-f32")
    os.makedirs(audio_dir, exist_ok=True)
    os.makedirs(out_dir, exist_ok=True)
    if a.make_audio:
        for name, x in make_audio().items():
            write_wav(os.path.join(audio_dir, f"{name}.wav"), x)
        speech = make_speech()
        if speech is None:
            print("make_goldens: no espeak-ng on PATH: speech.wav kept as committed", file=sys.stderr)
        else:
            write_wav(os.path.join(audio_dir, "speech.wav"), speech)
    tok = Tokenizer.from_file(os.path.join(a.hf_dir, "tokenizer.json"))
    prompt = [tok.token_to_id(s) for s in PROMPT]
    m32 = WhisperForConditionalGeneration.from_pretrained(a.hf_dir, attn_implementation="eager").eval()
    m64 = WhisperForConditionalGeneration.from_pretrained(a.hf_dir, attn_implementation="eager").double().eval()
    fe = feature_extractor()
    for wav in sorted(os.listdir(audio_dir)):
        if not wav.endswith(".wav"):
            continue
        name = wav[:-4]
        x = read_wav(os.path.join(audio_dir, wav))
        feats = fe(x, sampling_rate=SR, return_tensors="pt").input_features
        c32, fed, greedy = run(m32, feats, prompt, a.n_decode)
        c64, _, _ = run(m64, feats, prompt, a.n_decode, greedy=fed)
        mel = feats[0].numpy().astype(np.float64)
        ref = mel_f64(fe, x)
        arrays = {
            "mel": np.ascontiguousarray(mel.T, dtype=np.float32),
            "floor.mel": np.array([((mel - ref) ** 2).mean() / (ref * ref).mean()], dtype=np.float32),
        }
        for k, v in c32.items():
            arrays[k] = np.ascontiguousarray(v, dtype=np.float32)
            ref = c64[k]
            den = float((ref * ref).mean())
            arrays[f"floor.{k}"] = np.array([((v - ref) ** 2).mean() / den if den > 0 else 0.0], dtype=np.float32)
        arrays["tokens"] = np.array(prompt, dtype=np.int32)
        arrays["decode.tokens"] = np.array(fed, dtype=np.int32)
        arrays["greedy.tokens"] = np.array(greedy, dtype=np.int32)
        path = os.path.join(out_dir, f"{name}.npz")
        np.savez_compressed(path, **arrays)
        worst = max((float(arrays[k][0]), k) for k in arrays if k.startswith("floor."))
        print(f"{path}: {len(c32)} stages, greedy {greedy}, worst f32 floor {worst[0]:.3g} ({worst[1][6:]})",
              file=sys.stderr)
    write_manifest(a.golden_dir, a.hf_dir)
    if not a.no_run_entries:
        write_run_entries(a.golden_dir, a.hf_dir)


def write_run_entries(golden_dir, hf_dir):
    """The goldens' entries in golden/manifest.json, so that `lockstep run` holds the whisper cells like every
    other cell (ci/matrix.toml `whisper-seeded`): one entry per WAV, `input` naming the WAV the cell feeds the
    engine (kind `audio`, its path under golden/ and sha256), every array's shape and dtype (stored at the
    captured precision: f32 / i32, no storage error). Replaces the entries of this directory, keeps the others."""
    import hashlib
    import json
    import platform

    import torch
    import transformers

    sys.path.insert(0, os.path.join(ROOT, "oracles", "transformers"))
    from make_goldens import host_info  # noqa: E402  (oracles/transformers/make_goldens.py: the host CPU record)

    root = os.path.dirname(os.path.abspath(golden_dir))
    sub = os.path.basename(os.path.abspath(golden_dir))
    main = os.path.join(root, "manifest.json")
    with open(main) as f:
        m = json.load(f)
    sha = lambda p: hashlib.sha256(open(p, "rb").read()).hexdigest()  # noqa: E731
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    import tomllib
    with open(os.path.join(ROOT, "models.toml"), "rb") as f:
        # the checkpoint's registered digest (harness/src/hash.rs sha256_hf_dir), which `lockstep run` checks
        registered = next(c["sha256"] for c in tomllib.load(f)["checkpoints"] if c["id"] == sub)
    entries = []
    out_dir = os.path.join(golden_dir, "transformers-f32")
    for n in sorted(os.listdir(out_dir)):
        if not n.endswith(".npz"):
            continue
        name = n[:-4]
        path = os.path.join(out_dir, n)
        z = np.load(path)
        arrays = {}
        for k in z.files:
            a = z[k]
            arrays[k] = {"shape": list(a.shape), "dtype": {"float32": "f32", "int32": "i32"}[str(a.dtype)],
                         "storage_max_abs_err": 0.0, "storage_max_rel_err": 0.0, "storage_min_cosine": 1.0}
        wav = os.path.join(golden_dir, "audio", f"{name}.wav")
        tokens = [int(t) for t in z["tokens"]]
        decode = [int(t) for t in z["decode.tokens"]]
        entries.append({
            "path": f"{sub}/transformers-f32/{n}",
            "sha256": sha(path),
            "bytes": os.path.getsize(path),
            "model_id": sub,
            "model_sha256": registered,
            "model_file": os.path.relpath(hf_dir, ROOT),
            "arch": "whisper",
            "prompt_id": name,
            "prompt_kind": "audio",
            "prompt": "".join(PROMPT),
            "add_special": False,
            "parse_special": True,
            "input": {"kind": "audio", "path": os.path.relpath(wav, root), "sha256": sha(wav),
                      "note": "16 kHz mono 16-bit PCM: the engine computes its log-mel (stage `mel`) and encodes it; "
                              "the prompt is the decoder's control tokens"},
            "oracle": {"name": "transformers", "torch": torch.__version__, "transformers": transformers.__version__,
                       "numpy": np.__version__, **host_info(), "torch_threads": 1, "dtype": "float32",
                       "attn_implementation": "eager",
                       "loader": "WhisperForConditionalGeneration.from_pretrained(hf_dir, attn_implementation='eager'); "
                                 "mel: WhisperFeatureExtractor (oracles/whisper/make_goldens.py)"},
            "kv_type": "f32",
            "settings": {"n_threads": 1, "seed": None, "cache": "transformers EncoderDecoderCache (float32)",
                         "prefill": "encoder over the mel, then one decoder forward over the prompt",
                         "decode": "one decoder forward per token through the cache",
                         "sampling": "greedy: decode.tokens are transformers' own argmax (teacher-forced in the engine)"},
            "n_prompt_tokens": len(tokens),
            "n_decode_steps": len(decode),
            "continuation": tok.decode(decode, skip_special_tokens=False),
            "capture_changes_logits": 0.0,
            "capture_note": "forward hooks only read tensors; floor.<id> is each stage's f32-vs-f64 NMSE",
            "model_hparams": {"n_layer": cfg["decoder_layers"], "n_enc_layer": cfg["encoder_layers"],
                              "n_embd": cfg["d_model"], "n_vocab": cfg["vocab_size"]},
            "arrays": arrays,
        })
    m["goldens"] = [e for e in m["goldens"] if not e["path"].startswith(sub + "/")] + entries
    sys.path.insert(0, os.path.join(ROOT, "oracles"))
    import manifest_format  # noqa: E402  (golden/manifest.json's text layout, shared by the oracles)
    with open(main, "w") as f:
        f.write(manifest_format.dump_manifest(m))
    print(f"{main}: {len(entries)} entries of {sub}", file=sys.stderr)


def write_manifest(golden_dir, hf_dir):
    """golden/whisper-seeded/manifest.json: the sha256 of every WAV and golden (harness/tests/whisper.rs checks
    them), and the checkpoint they were made from. Its own manifest keeps this directory out of
    golden/manifest.json's token-prompt goldens (a subdirectory with a manifest is another golden directory)."""
    import hashlib
    import json

    import torch
    import transformers

    files = {}
    for sub in ("audio", "transformers-f32"):
        for n in sorted(os.listdir(os.path.join(golden_dir, sub))):
            with open(os.path.join(golden_dir, sub, n), "rb") as f:
                files[f"{sub}/{n}"] = hashlib.sha256(f.read()).hexdigest()
    m = {
        "format": "lockstep-whisper-goldens-1",
        "about": "oracles/whisper/make_goldens.py: WhisperFeatureExtractor mel + WhisperForConditionalGeneration "
                 "stages (eager attention, float32; floor.* against float64) of the checkpoint below",
        "checkpoint": os.path.relpath(hf_dir, ROOT),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "files": files,
    }
    with open(os.path.join(golden_dir, "manifest.json"), "w") as f:
        json.dump(m, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
