"""Speak lockstep's engine session protocol (version 2; version 1 requests too) from Python, with numpy only.

An engine under test is an object with these methods (README, "Plugging in another engine"):

    load(model_path, mode, target[, format]) -> dict
                                               # format: "gguf" (a GGUF file) or "hf" (a directory with
                                               #  config.json, *.safetensors, tokenizer.json); an engine whose
                                               #  load takes no `format` reads GGUF only (an "hf" load is
                                               #  answered unsupported)
                                               # returns {"engine": "name@version", "capabilities": [...],
                                               #  optional "n_vocab", "stages" (its names in forward order),
                                               #  "output": "pooled" for an encoder}
    reset(mode, target, n_ctx) -> None         # a new sequence: empty KV cache, next position 0
    step(tokens, start) -> (logits, stages)    # run tokens at positions start.., through its KV cache;
                                               # logits float32 [n, V]; stages {name: float32 [n, D]};
                                               # an encoder: logits None, stages["pooled"] [1, D]
    engine_name                                # optional attribute, "name@version": a `load` that fails
                                               #  still names the engine, so its refused cells are named
                                               #  after it (`unsupported`: raise NotImplementedError)
    tokenize(text, add_special, parse_special) -> list[int]   # only with the capability "tokenize"
    inject(stage, value) -> None               # only with "inject": use value [n, D] in place of the
                                               # stage in the next step, after recording its own value

`serve(engine)` reads requests on stdin and answers on stdout, one JSON object per line; while the
engine runs, `print` goes to stderr (stdout belongs to the protocol). `write_dump` writes the dump format
(`lockstep_dump_version`, `tokens`, `logits`, stages); `read_gguf` reads a GGUF file's metadata and its
F32/F16 tensors (numpy arrays in numpy's axis order: ggml's dims reversed), enough for a reference engine;
`gguf_architecture` reads a GGUF's `general.architecture` alone, cheaply;
`read_safetensors` reads an HF checkpoint directory's tensors (F32, F16, BF16; shards through
model.safetensors.index.json).

Protocol versions: lockstep sends `load` with `"protocol": 2` and `"format"`; this helper answers with the
version asked (1 or 2; a version-1 request has no `format` and names a GGUF file).
"""

import contextlib
import inspect
import json
import os
import struct
import sys

import numpy as np

PROTOCOL_VERSION = 2
# the versions this helper answers: 1 (GGUF models only, no `format`) and 2
PROTOCOL_VERSIONS = (1, 2)
# `load`'s model formats (protocol 2): a GGUF file, or an HF checkpoint directory
FORMATS = ("gguf", "hf")
DUMP_FORMAT_VERSION = 1


def write_dump(path, tokens, logits, stages):
    """Write one step's dump: tokens int32 [n], logits float32 [n, V], each stage float32 [n, D].

    An encoder's dump (`logits` None) has no logits; its output is the stage `pooled`, float32 [1, D] (the
    row of the step's last position). Written to a temporary name in the same directory and renamed, so a
    reader never sees half a file.
    """
    tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
    arrays = {
        "lockstep_dump_version": np.array([DUMP_FORMAT_VERSION], dtype=np.int32),
        "tokens": tokens,
    }
    encoder = logits is None
    if not encoder:
        arrays["logits"] = np.ascontiguousarray(logits, dtype=np.float32)
    elif "pooled" not in stages:
        raise ValueError("an encoder's dump (no logits) needs the stage 'pooled' [1, D]")
    for name, a in stages.items():
        if name in arrays:
            raise ValueError(f"stage name {name!r} collides with a reserved array")
        a = np.ascontiguousarray(a, dtype=np.float32)
        rows = 1 if encoder and name == "pooled" else len(tokens)
        if a.ndim != 2 or a.shape[0] != rows:
            raise ValueError(f"stage {name!r} is {a.shape}, expected [{rows}, D]")
        arrays[name] = a
    if not encoder and arrays["logits"].shape[0] != len(tokens):
        raise ValueError(f"logits are {arrays['logits'].shape}, expected [{len(tokens)}, V]")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **arrays)
    os.replace(tmp, path)


def read_value(path):
    """The `value` array of an `inject` request's .npz, float32 [n, D]."""
    with np.load(path) as z:
        v = z["value"]
    if v.dtype != np.float32 or v.ndim != 2:
        raise ValueError(f"{path}: `value` is {v.dtype} {v.shape}, expected float32 [n, D]")
    return v


_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf(path):
    """(metadata dict, {tensor name: numpy array}) of a GGUF v2/v3 file; F32 and F16 tensors only
    (others raise, naming the tensor). Arrays are views of a memory map, in numpy order (ggml dims
    reversed: `token_embd.weight` is [n_vocab, n_embd])."""
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    mv = memoryview(buf)
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, mv, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def string():
        nonlocal pos
        n = take("<Q")
        s = bytes(mv[pos:pos + n]).decode("utf-8", "replace")
        pos += n
        return s

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            it, n = take("<I"), take("<Q")
            return [value(it) for _ in range(n)]
        return take(_SCALARS[t])

    if bytes(mv[0:4]) != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    pos = 4
    version, n_tensors, n_kv = take("<I"), take("<Q"), take("<Q")
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version}")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("<Q") for _ in range(take("<I"))]
        infos.append((name, dims, take("<I"), take("<Q")))
    align = meta.get("general.alignment", 32)
    base = (pos + align - 1) // align * align
    tensors = {}
    for name, dims, t, off in infos:
        dtype = {0: np.float32, 1: np.float16}.get(t)
        if dtype is None:
            raise NotImplementedError(f"{path}: tensor {name} has ggml type {t}; read_gguf reads F32 and F16 only")
        n = int(np.prod(dims))
        a = np.frombuffer(buf, dtype=dtype, count=n, offset=base + off)
        tensors[name] = a.reshape(list(reversed(dims)))
    return meta, tensors


def gguf_architecture(path):
    """`general.architecture` of a GGUF file, read from its header without reading the rest (a converter
    writes it first; the keys before it are skipped): cheap enough to refuse a model before `read_gguf`
    parses a vocabulary of 150k tokens. `None` when the file does not say; ValueError when it is no GGUF."""
    with open(path, "rb") as f:
        head = f.read(24)
        if head[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        n_kv = struct.unpack_from("<Q", head, 16)[0]
        for _ in range(n_kv):
            key = f.read(struct.unpack("<Q", f.read(8))[0]).decode("utf-8", "replace")
            t = struct.unpack("<I", f.read(4))[0]
            if t == 8:
                v = f.read(struct.unpack("<Q", f.read(8))[0]).decode("utf-8", "replace")
                if key == "general.architecture":
                    return v
            elif t in _SCALARS:
                f.read(struct.calcsize(_SCALARS[t]))
            else:
                return None  # an array before it: give up cheaply, the full read will tell
    return None


_ST_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


def read_safetensors(path):
    """{tensor name: numpy array} of an HF checkpoint directory (or of one .safetensors file).

    A directory is read through `model.safetensors.index.json` (its `weight_map` names the shard of each
    tensor) when present, else its `model.safetensors`. F32 tensors are read-only views of a memory map;
    F16 and BF16 tensors are returned as float32 (BF16 widened exactly: its 16 bits are a float32's upper
    half). Shapes are as stored (PyTorch's: a Linear weight is [out_features, in_features]). Other dtypes
    raise NotImplementedError naming the tensor; a malformed header raises ValueError naming the file
    (the layout: safetensors' format, an 8-byte little-endian header length, a JSON header, the data).
    """
    if os.path.isdir(path):
        index = os.path.join(path, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index) as f:
                weight_map = json.load(f).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index}: no `weight_map` object naming each tensor's shard")
            files = sorted(set(weight_map.values()))
        else:
            files = ["model.safetensors"]
        out = {}
        for name in files:
            for k, v in read_safetensors(os.path.join(path, name)).items():
                if k in out:
                    raise ValueError(f"{path}: tensor {k} is in two shards")
                out[k] = v
        return out
    buf = np.memmap(path, dtype=np.uint8, mode="r")
    if len(buf) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    n = int(np.frombuffer(buf, dtype="<u8", count=1)[0])
    if n > len(buf) - 8:
        raise ValueError(f"{path}: header length {n} runs past the end of the file ({len(buf)} bytes)")
    try:
        header = json.loads(bytes(buf[8:8 + n]).decode("utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: the safetensors header is not JSON: {e}") from None
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise NotImplementedError(f"{path}: tensor {name} has dtype {info.get('dtype')}; read_safetensors reads F32, F16, BF16")
        (start, end), shape = info["data_offsets"], [int(d) for d in info["shape"]]
        count = int(np.prod(shape)) if shape else 1
        if end - start != count * np.dtype(dtype).itemsize or base + end > len(buf):
            raise ValueError(f"{path}: tensor {name}: data_offsets {start}..{end} do not hold {info['dtype']} {shape}")
        a = np.frombuffer(buf, dtype=dtype, count=count, offset=base + start).reshape(shape)
        if info["dtype"] == "F16":
            a = a.astype(np.float32)
        elif info["dtype"] == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        out[name] = a
    return out


def _takes_format(load):
    """True when an engine's `load` takes the model's `format` (a fourth parameter or `format=`)."""
    try:
        params = inspect.signature(load).parameters
    except (TypeError, ValueError):
        return False
    return "format" in params or len(params) >= 4 or any(p.kind == p.VAR_POSITIONAL for p in params.values())


def serve(engine, stdin=None, stdout=None):
    """Answer protocol requests from `stdin` on `stdout` until `shutdown` or end of input. A request
    the engine fails is answered {"ok": false, "error": ...} and serving goes on; a NotImplementedError
    (a model or setting the engine cannot run at all) adds "unsupported": true, so lockstep fails that
    cell as engine_error and runs the others (as it does for any failed `load`, which names the engine
    when it has an `engine_name`)."""
    stdin = stdin or sys.stdin
    out = stdout or sys.stdout
    state = {"scratch": None, "pos": 0, "steps": 0, "caps": set()}

    def handle(req):
        op = req.get("op")
        if op == "load":
            version = req.get("protocol")
            if version not in PROTOCOL_VERSIONS:
                raise ValueError(f"protocol {version} asked; this helper speaks {', '.join(map(str, PROTOCOL_VERSIONS))}")
            fmt = req.get("format", "gguf") if version >= 2 else "gguf"
            if fmt not in FORMATS:
                raise ValueError(f"`load` format {fmt!r}; the protocol knows {', '.join(FORMATS)}")
            state["scratch"] = req["scratch"]
            if _takes_format(engine.load):
                info = dict(engine.load(req["model"], req["mode"], req["target"], fmt))
            elif fmt == "gguf":
                info = dict(engine.load(req["model"], req["mode"], req["target"]))
            else:
                raise NotImplementedError(f"this engine reads GGUF files only; {req['model']} is an HF ({fmt}) checkpoint")
            state["caps"] = set(info.get("capabilities", []))
            return {"protocol": version, **info}
        if op == "tokenize":
            if "tokenize" not in state["caps"]:
                raise ValueError("this engine does not tokenize (no `tokenize` capability)")
            return {"tokens": [int(t) for t in engine.tokenize(req["text"], req["add_special"], req["parse_special"])]}
        if op == "reset":
            engine.reset(req["mode"], req["target"], req["n_ctx"])
            state["pos"] = 0
            return {}
        if op in ("prefill", "decode"):
            tokens = req["tokens"] if op == "prefill" else [req["token"]]
            logits, stages = engine.step(list(tokens), state["pos"])
            path = os.path.join(state["scratch"], f"step-{state['steps']}.npz")
            write_dump(path, tokens, logits, stages)
            state["pos"] += len(tokens)
            state["steps"] += 1
            return {"dump": path}
        if op == "inject":
            if "inject" not in state["caps"]:
                raise ValueError("this engine does not take `inject` (no `inject` capability)")
            engine.inject(req["stage"], read_value(req["npz"]))
            return {}
        raise ValueError(f"unknown op {op!r}")

    for line in stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except ValueError as e:
            req, reply = None, {"ok": False, "error": f"not a protocol request: {e}"}
        if req is not None and req.get("op") == "shutdown":
            out.write('{"ok":true}\n')
            out.flush()
            return
        if req is not None:
            try:
                with contextlib.redirect_stdout(sys.stderr):
                    reply = {"ok": True, **handle(req)}
            except Exception as e:  # the engine's failure is the answer, not the end of the session
                reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
                if isinstance(e, NotImplementedError):
                    # the engine cannot run this model or setting: lockstep fails the cell, goes on
                    reply["unsupported"] = True
                name = getattr(engine, "engine_name", None)
                if req.get("op") == "load" and isinstance(name, str) and name:
                    # a refused model's cells are named after the engine that refused it
                    reply["engine"] = name
        out.write(json.dumps(reply) + "\n")
        out.flush()
