"""Write a Hugging Face directory (config.json, model.safetensors, tokenizer.json) of a GGUF through transformers'
own GGUF loader (tf_capture.load: the loader fixes applied, float32), for comparing the HF route with the GGUF
route where lockstep's `export-hf` is not at hand (README "The HF route"). Not the seeded models' HF copies of
record: those are lockstep's (`lockstep export-hf`).

    python gguf_to_hf.py --gguf PATH --out DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tf_capture as C  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if not args.gguf.is_file():
        raise SystemExit(f"{args.gguf}: no such file")
    model, _ = C.load(args.gguf, torch.float32)
    # save_pretrained refuses a model loaded from a GGUF ("quantized with gguf and not serializable"): the config
    # without its quantization record, and the float32 weights (tied ones once: safetensors' save_model)
    from safetensors.torch import save_model

    args.out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.save_pretrained(str(args.out))
    save_model(model, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(args.gguf.parent), gguf_file=args.gguf.name)
    tok.save_pretrained(str(args.out))
    print(f"{args.out}: {sorted(p.name for p in args.out.iterdir())}; notes: {model.lockstep_load_notes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
