#!/usr/bin/env python3
"""The first byte where two GGUF files differ, and where it lies: header, which metadata key, which tensor
info, padding, or which tensor's data (and which block of it, the block's bytes on both sides).

    oracles/llamacpp/gguf_first_diff.py OURS.gguf THEIRS.gguf

Used to check `lockstep quantize` against llama-quantize's files (`make_variants.sh`). Exit 0 when the
files are identical, 1 when they differ. Standard library only.
"""
import struct
import sys

# ggml type id -> (name, block elements, block bytes)
TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
         7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84),
         11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
         15: ("Q8_K", 256, 292), 20: ("IQ4_NL", 32, 18), 23: ("IQ4_XS", 256, 136), 30: ("BF16", 1, 2)}
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def regions(buf):
    """[(start, end, label, extra)] covering the file in order."""
    out = []
    pos = 24
    n_tensors, n_kv = struct.unpack_from("<qq", buf, 8)
    out.append((0, 24, "header", None))

    def string(p):
        (n,) = struct.unpack_from("<Q", buf, p)
        return buf[p + 8:p + 8 + n].decode("utf-8", "replace"), p + 8 + n

    def value(p, t):
        if t in SCALAR:
            return p + SCALAR[t]
        if t == 8:
            return string(p)[1]
        if t == 9:
            et, n = struct.unpack_from("<IQ", buf, p)
            p += 12
            for _ in range(n):
                p = value(p, et)
            return p
        raise ValueError(f"unknown type {t} at {p}")

    for i in range(n_kv):
        start = pos
        key, pos = string(pos)
        (t,) = struct.unpack_from("<I", buf, pos)
        pos = value(pos + 4, t)
        out.append((start, pos, f"metadata entry {i} '{key}'", None))
    infos = []
    for i in range(n_tensors):
        start = pos
        name, pos = string(pos)
        (nd,) = struct.unpack_from("<I", buf, pos)
        dims = struct.unpack_from(f"<{nd}q", buf, pos + 4)
        pos += 4 + 8 * nd
        ty, off = struct.unpack_from("<iQ", buf, pos)
        pos += 12
        infos.append((name, dims, ty, off))
        out.append((start, pos, f"tensor info {i} '{name}'", None))
    data = (pos + 31) // 32 * 32
    out.append((pos, data, "header padding", None))
    for name, dims, ty, off in infos:
        tname, be, bb = TYPES.get(ty, (str(ty), 1, 1))
        n = 1
        for d in dims:
            n *= d
        size = n // be * bb
        out.append((data + off, data + off + size, f"tensor '{name}' {tname} {list(dims)}", (be, bb, dims)))
        end = data + off + size
        out.append((end, (end + 31) // 32 * 32, f"padding after '{name}'", None))
    return out


def main():
    a, b = (open(p, "rb").read() for p in sys.argv[1:3])
    n = min(len(a), len(b))
    first = next((i for i in range(n) if a[i] != b[i]), None) if a[:n] != b[:n] else None
    if first is None:
        if len(a) == len(b):
            print("identical")
            return 0
        print(f"same first {n} bytes; sizes {len(a)} vs {len(b)}")
        return 1
    print(f"sizes {len(a)} vs {len(b)}; first difference at byte {first}")
    for name, buf in (("first", a), ("second", b)):
        for start, end, label, extra in regions(buf):
            if start <= first < end:
                line = f"  in the {name} file: {label}, byte {first - start} of {end - start}"
                if extra:
                    be, bb, dims = extra
                    blk = (first - start) // bb
                    row_blocks = dims[0] // be
                    line += f"; block {blk} (row {blk // row_blocks}, block {blk % row_blocks} of the row)"
                    bs = start + blk * bb
                    line += f"\n    first:  {a[bs:bs + bb].hex()}\n    second: {b[bs:bs + bb].hex()}"
                print(line)
                break
    return 1


if __name__ == "__main__":
    sys.exit(main())
