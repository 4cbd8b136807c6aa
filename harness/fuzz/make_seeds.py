"""Write the committed seed inputs of the harness fuzz targets (stdlib only; reproducible bytes).

    python3 harness/fuzz/make_seeds.py

seeds/golden_read/tiny.npz matches the manifest entry built into fuzz_targets/golden_read.rs; the
npz_read and dump_read seeds are a dump of 2 tokens and the same golden; seeds/quality_base_logits/tiny.bin
is a quality base-logits cache (format 3, harness/src/quality/base.rs) of one 4-token chunk over a
vocabulary of 8, read back by that module's tests.
"""
import struct
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def npy(descr, shape, data):
    dims = ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "")
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + data


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def i32(values):
    return struct.pack("<%di" % len(values), *values)


def f16(values):
    return struct.pack("<%de" % len(values), *values)


def write(path, members):
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members:
            info = zipfile.ZipInfo(name + ".npy", date_time=(2026, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)


logits = [0.5, -1.0, 2.0, 0.25, -0.5, 1.5, 0.0, 3.0]
golden = [
    ("tokens", npy("<i4", [2], i32([1, 5]))),
    ("logits", npy("<f4", [1, 8], f32(logits))),
    ("logits_positions", npy("<i4", [1], i32([1]))),
    ("logits_topk_ids", npy("<i4", [2, 4], i32([7, 2, 5, 0, 7, 2, 5, 0]))),
    ("logits_topk", npy("<f4", [2, 4], f32([3.0, 2.0, 1.5, 0.5] * 2))),
    ("decode.tokens", npy("<i4", [1], i32([7]))),
    ("decode.logits", npy("<f4", [1, 8], f32(logits[::-1]))),
    ("blk.0.out", npy("<f2", [2, 4], f16([0.5, -0.25, 1.0, 2.0, 0.0, 1.0, -1.0, 0.125]))),
    ("decode.blk.0.out", npy("<f2", [1, 4], f16([1.0, 2.0, 3.0, 4.0]))),
]
dump = [
    ("lockstep_dump_version", npy("<i4", [1], i32([1]))),
    ("tokens", npy("<i4", [2], i32([1, 5]))),
    ("logits", npy("<f4", [2, 8], f32(logits + logits[::-1]))),
    ("blk.0.out", npy("<f4", [2, 4], f32([0.5, -0.25, 1.0, 2.0, 0.0, 1.0, -1.0, 0.125]))),
]
write(HERE / "seeds/golden_read/tiny.npz", golden)
write(HERE / "seeds/npz_read/golden.npz", golden)
write(HERE / "seeds/npz_read/dump.npz", dump)
write(HERE / "seeds/dump_read/dump.npz", dump)


def base_logits():
    """A valid quality base-logits cache: LSQBASE3, the JSON key, tokens, one scored row, one full row,
    and the sha256 of everything before it."""
    import hashlib
    import json
    header = {
        "corpus_sha256": "0" * 64, "base_sha256": "0" * 64, "base_path": "tiny-F32.gguf",
        "n_ctx": 4, "n_chunks": 1, "mode": "ggml", "window": 16.0, "max_kept": 2, "n_vocab": 8,
        "corpus_tokens": 4, "full_kl_chunks": 1,
    }
    h = json.dumps(header, separators=(",", ":")).encode()
    body = b"LSQBASE3" + struct.pack("<I", len(h)) + h
    body += struct.pack("<4I", 1, 5, 7, 2)  # the chunk's tokens
    # one scored row (n_ctx - 1 - n_ctx/2): n_kept, ln sum exp, tail mass, next token's logit, ids, logits
    body += struct.pack("<Iddf", 2, 0.5, 0.125, 1.5) + struct.pack("<2H", 7, 2) + f32([3.0, 2.0])
    body += f32(logits)  # the full row of the first chunk's scored token
    return body + hashlib.sha256(body).digest()


(HERE / "seeds/quality_base_logits").mkdir(parents=True, exist_ok=True)
(HERE / "seeds/quality_base_logits/tiny.bin").write_bytes(base_logits())
