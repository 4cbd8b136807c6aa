"""Propose a stage map (stage_maps/<model_type>.toml, README "Stage maps") for an architecture this oracle has never
seen, from the module tree of a Hugging Face directory and one traced forward call, for the porter to confirm.

    python propose_stage_map.py --hf-dir DIR [--out FILE] [--tokens 5]

What it does: builds the model (from_pretrained(DIR) in float32 when DIR has weights, else from config.json with
transformers' random init: the map depends on the wiring, not on the numbers), hooks EVERY module, and runs one
forward over a few token ids through `lockstep_eager` (tf_capture's attention function), recording each module's
call order, class, input and output shapes and tensors. Layer 0 of the decoder stack (the ModuleList of
num_hidden_layers children) is then read in call order:

- projections by attribute name: q/k/v (q_proj, query, ...), fused [q|k|v] (qkv_proj, c_attn, ...: `columns`),
  the attention output projection (o_proj, out_proj, c_proj/dense inside attention): its input is attn_out, its
  output attn_proj; gate/up/down (or c_fc/fc1 and c_proj/fc2; fused gate_up_proj: `columns`): ffn_gate, ffn_up,
  down's input ffn_act, down's output ffn_out;
- q_norm/k_norm by name: their traced output says the layout ([B, H, T, D] -> heads_first = true; [B, T, H, D]
  -> false; [B, T, H*D], a norm over the whole projection (OLMo 2) -> no heads_first);
- norms (class name *Norm) by DATA, not by name: one whose input is the layer input -> attn_norm; one whose input is
  the attention output projection's output -> attn_post_norm; one whose input is the MLP's output -> ffn_post_norm;
  one whose output feeds the MLP -> ffn_norm, its input ffn_inp; without such a norm ffn_inp is the MLP's input;
- the layer's output -> blk.N.out; RoPE (q_rope/k_rope from the attention function) only where the Q attention
  receives differs from the projection (or its norm): gpt2-style learned positions get none;
- embed: the embedding module's output if it is the first layer's input bit for bit, else the first layer's input
  itself (an embedding multiplier, learned positions); output_norm: the norm called after the last layer; logits:
  lm_head's output if it is the model's output logits bit for bit, else the model's output (`logits_result`: a
  soft-cap or a logits scaling after lm_head).

Every row is written with a comment saying why it was proposed; what it could not place is listed at the end as
comments. Nothing is guessed silently: the porter reads the file, fixes what is wrong, and keeps it.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tf_capture as C  # noqa: E402

Q_NAMES = ("q_proj", "query", "wq", "q_lin")
K_NAMES = ("k_proj", "key", "wk", "k_lin")
V_NAMES = ("v_proj", "value", "wv", "v_lin")
QKV_NAMES = ("qkv_proj", "c_attn", "query_key_value", "Wqkv", "qkv", "W_pack")
O_NAMES = ("o_proj", "out_proj", "c_proj", "dense", "wo", "out_lin")
GATE_NAMES = ("gate_proj", "w1", "gate")
UP_NAMES = ("up_proj", "w3", "c_fc", "fc1", "fc_in", "dense_h_to_4h", "lin1")
DOWN_NAMES = ("down_proj", "w2", "c_proj", "fc2", "fc_out", "dense_4h_to_h", "lin2")
GATE_UP_NAMES = ("gate_up_proj",)
ATTN_NAMES = ("self_attn", "attn", "attention", "self_attention")
MLP_NAMES = ("mlp", "feed_forward", "ffn")


@dataclass
class Call:
    order: int
    name: str
    cls: str
    inp: torch.Tensor | None
    out: torch.Tensor | None
    in_shape: list = field(default_factory=list)
    out_shape: list = field(default_factory=list)


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)):
        for y in x:
            t = _first_tensor(y)
            if t is not None:
                return t
    if isinstance(x, dict):
        for y in x.values():
            t = _first_tensor(y)
            if t is not None:
                return t
    if hasattr(x, "to_tuple"):
        return _first_tensor(x.to_tuple())
    return None


def build(hf_dir: Path):
    """The model of `hf_dir` in float32 with lockstep_eager: from_pretrained if it has weights, else from_config
    (random init, seed 0). Returns (model, how it was built)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(hf_dir))
    if list(hf_dir.glob("*.safetensors")):
        model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, attn_implementation=C.ATTN)
        how = "from_pretrained (the directory's weights)"
    else:
        torch.manual_seed(0)
        cfg._attn_implementation = C.ATTN
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation=C.ATTN)
        how = "from_config (no *.safetensors: transformers' random init, seed 0)"
    model.eval()
    return model, how


def trace(model, n_tokens: int) -> tuple[list[Call], dict, torch.Tensor]:
    """One forward over token ids 1..n_tokens with a hook on every module; returns the calls in call order (first
    call of each module), the Q/K lockstep_eager received per layer ([T, H*D]) and the output logits [T, V]."""
    calls: dict[str, Call] = {}
    order = [0]
    handles = []
    for name, mod in model.named_modules():
        if not name:
            continue

        def pre(m, args, kwargs, name=name):
            if name not in calls:
                x = _first_tensor(args) if args else _first_tensor(kwargs.get("hidden_states", kwargs))
                calls[name] = Call(order[0], name, type(m).__name__, None if x is None else x.detach().clone(), None,
                                   [] if x is None else list(x.shape))
                order[0] += 1

        def post(m, args, kwargs, out, name=name):
            c = calls[name]
            if c.out is None:
                y = _first_tensor(out)
                c.out = None if y is None else y.detach().clone()
                c.out_shape = [] if y is None else list(y.shape)

        handles.append(mod.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(mod.register_forward_hook(post, with_kwargs=True))
    vocab = model.config.vocab_size
    ids = torch.tensor([[(1 + i) % vocab for i in range(n_tokens)]])
    empty = C.StageMap(Path("<trace>"), "", "", "", "hf", "", {}, ())
    C._RECORDER = C.Recorder(empty, model.config.num_attention_heads,
                             getattr(model.config, "num_key_value_heads", None) or model.config.num_attention_heads)
    try:
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=False)
        attn_in = dict(C._RECORDER.attn_in)
    finally:
        C._RECORDER = None
        for h in handles:
            h.remove()
    return sorted(calls.values(), key=lambda c: c.order), attn_in, out.logits[0].detach()


def same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return a is not None and b is not None and a.shape == b.shape and torch.equal(a, b)


def leaf(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def propose(model, calls: list[Call], attn_in: dict, logits: torch.Tensor, how: str, hf_dir: Path) -> str:
    cfg = model.config
    n_layer = cfg.num_hidden_layers
    by_name = {c.name: c for c in calls}
    # the decoder stack: a ModuleList of n_layer children, called in order
    stacks = [n for n, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n_layer
              and f"{n}.0" in by_name]
    if not stacks:
        raise SystemExit(f"{hf_dir}: no ModuleList of num_hidden_layers ({n_layer}) modules was called: not a decoder stack")
    stack = stacks[0]
    l0 = f"{stack}.0"
    pat = f"{stack}.{{N}}"
    inside = [c for c in calls if c.name.startswith(l0 + ".")]
    layer = by_name[l0]
    rows: list[tuple[str, str, str, dict, str]] = []  # id, module, hook, options, comment
    unplaced: list[str] = []

    def rel(name: str) -> str:
        return pat + name[len(l0):]

    def find(names, within: str | None = None, exclude=()) -> Call | None:
        for c in inside:
            if within is not None and not c.name.startswith(within + "."):
                continue
            if c.name in exclude:
                continue
            if leaf(c.name) in names:
                return c
        return None

    attn = next((c for c in inside if leaf(c.name) in ATTN_NAMES and c.name.count(".") == l0.count(".") + 1), None)
    mlp = next((c for c in inside if leaf(c.name) in MLP_NAMES and c.name.count(".") == l0.count(".") + 1), None)
    if attn is None:
        raise SystemExit(f"{hf_dir}: layer 0 ({l0}) has no attention module named one of {ATTN_NAMES}")
    if mlp is None:
        raise SystemExit(f"{hf_dir}: layer 0 ({l0}) has no MLP module named one of {MLP_NAMES}")
    n_q = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_q
    try:
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_q
    except Exception:  # noqa: BLE001 -- gemma4: a per-layer head_dim (AmbiguousGlobalPerLayerAttributeError)
        head_dim = "per-layer"

    # --- norms, placed by data -------------------------------------------------------------------------------
    norms = [c for c in inside if re.search(r"norm", c.cls, re.I) and not c.name.startswith(attn.name + ".")
             and not c.name.startswith(mlp.name + ".")]
    o = find(O_NAMES, within=attn.name)
    qkv = find(QKV_NAMES, within=attn.name)
    q = find(Q_NAMES, within=attn.name)
    k = find(K_NAMES, within=attn.name)
    v = find(V_NAMES, within=attn.name)
    gate_up = find(GATE_UP_NAMES, within=mlp.name)
    down = find(DOWN_NAMES, within=mlp.name)
    gate = find(GATE_NAMES, within=mlp.name) if gate_up is None else None
    up = find(UP_NAMES, within=mlp.name, exclude=(down.name,) if down else ()) if gate_up is None else None
    attn_norm = next((n for n in norms if same(n.inp, layer.inp)), None)
    post_attn = next((n for n in norms if o is not None and same(n.inp, o.out)), None)
    post_ffn = next((n for n in norms if same(n.inp, mlp.out)), None)
    ffn_norm = next((n for n in norms if same(n.out, mlp.inp) and n is not attn_norm), None)
    for n in norms:
        if n not in (attn_norm, post_attn, post_ffn, ffn_norm):
            unplaced.append(f"{rel(n.name)} ({n.cls}, input {n.in_shape}): a norm whose input is neither the layer "
                            f"input, the attention output nor the MLP output and whose output does not feed the MLP")

    def add(cid, c: Call, hook, comment, **opts):
        rows.append((cid, rel(c.name) if c.name.startswith(l0) else c.name, hook, opts, comment))

    if attn_norm:
        add("blk.{N}.attn_norm", attn_norm, "output", f"{attn_norm.cls}: its input is the layer's input (pre-norm)")
    # --- Q/K/V -------------------------------------------------------------------------------------------------
    if qkv is not None:
        for part in ("q", "k", "v"):
            add(f"blk.{{N}}.{part}", qkv, "columns", f"fused {leaf(qkv.name)} output {qkv.out_shape}: [q | k | v] "
                f"columns ({n_q}+{n_kv}+{n_kv} heads of {head_dim})", columns=part)
    else:
        # a layer whose attention has no v_proj (None: gemma4's attention_k_eq_v layers) reads k_proj there
        stack_mod = model.get_submodule(stack)
        attn_leaf = attn.name[len(l0) + 1:]
        v_missing = v is not None and any(getattr(lay.get_submodule(attn_leaf), leaf(v.name), 0) is None for lay in stack_mod)
        for cid, c in (("q", q), ("k", k), ("v", v)):
            if c is None:
                unplaced.append(f"blk.N.{cid}: no projection named one of {dict(q=Q_NAMES, k=K_NAMES, v=V_NAMES)[cid]}")
            elif cid == "v" and v_missing and k is not None:
                add("blk.{N}.v", c, "output", f"{leaf(c.name)} is None on some layers (V = the K projection there): "
                    f"{leaf(k.name)} read on those", fallback=rel(k.name))
            else:
                add(f"blk.{{N}}.{cid}", c, "output", f"{c.cls} {leaf(c.name)}: output {c.out_shape}")
    last_q = q
    last_k = k
    for cid, nm in (("q_norm", "q_norm"), ("k_norm", "k_norm")):
        c = find((nm, nm.replace("_norm", "_layernorm"), nm.replace("_", "")), within=attn.name)
        if c is None:
            continue
        shape = c.out_shape
        opts, what = {}, ""
        if len(shape) == 4:
            t = shape[2] if shape[1] in (n_q, n_kv) else shape[1]
            opts["heads_first"] = shape[1] in (n_q, n_kv) and shape[2] == t and shape[1] != t
            what = "[B, H, T, D]: heads first (transposed back)" if opts["heads_first"] else "[B, T, H, D]: per head"
        else:
            what = f"{shape}: a norm over the whole projection (no per-head view)"
        add(f"blk.{{N}}.{cid}", c, "output", f"{c.cls}: output {what}", **opts)
        if cid == "q_norm":
            last_q = c
        else:
            last_k = c
    # RoPE: does the Q attention receives differ from the projection (or its norm)? (rows past position 0: RoPE
    # turns nothing at position 0)
    rope = None
    qp = None
    if last_q is not None and last_q.out is not None:
        qp = last_q.out[0]
        if qp.dim() == 3 and 0 in attn_in and qp.shape[0] != attn_in[0][0].shape[0]:  # [H, T, D] -> [T, H, D]
            qp = qp.transpose(0, 1)
        qp = qp.reshape(qp.shape[0], -1)
    elif qkv is not None and qkv.out is not None and isinstance(head_dim, int):
        qp = qkv.out[0][..., : n_q * head_dim]  # the q columns of the fused projection
    if 0 in attn_in and qp is not None:
        qa = attn_in[0][0]
        rope = not (qa.shape == qp.shape and torch.equal(qa[1:], qp[1:]))
    if rope:
        rows.append(("blk.{N}.q_rope", rel(attn.name), "attn_query", {"describe": f"{rel(attn.name)} (lockstep_eager: query)"},
                     "the Q attention receives differs from the projection's: rotated (RoPE) at the attention call"))
        rows.append(("blk.{N}.k_rope", rel(attn.name), "attn_key", {"describe": f"{rel(attn.name)} (lockstep_eager: key, this step's rows)"},
                     "K as attention receives it (this step's rows)"))
    elif rope is False:
        unplaced.append("q_rope/k_rope: none proposed: attention receives Q as projected (no RoPE: learned or no positions)")
    else:
        unplaced.append("q_rope/k_rope: lockstep_eager was not called for layer 0 (another attention path?): check by hand")
    if o is not None:
        add("blk.{N}.attn_out", o, "input", f"{leaf(o.name)}'s input: the heads' output {o.in_shape}")
        add("blk.{N}.attn_proj", o, "output", f"{leaf(o.name)}'s output (before any residual)")
    else:
        unplaced.append(f"attn_out/attn_proj: no output projection named one of {O_NAMES} in {rel(attn.name)}")
    if post_attn:
        add("blk.{N}.attn_post_norm", post_attn, "output", f"{post_attn.cls}: its input is the attention output projection's output")
    # --- FFN ---------------------------------------------------------------------------------------------------
    if ffn_norm:
        add("blk.{N}.ffn_inp", ffn_norm, "input", "the residual after attention: the pre-FFN norm's input")
        add("blk.{N}.ffn_norm", ffn_norm, "output", f"{ffn_norm.cls}: its output is the MLP's input")
    else:
        add("blk.{N}.ffn_inp", mlp, "input", "no norm before the MLP: the residual after attention is the MLP's input")
    if gate_up is not None:
        add("blk.{N}.ffn_gate", gate_up, "columns", f"fused {leaf(gate_up.name)} {gate_up.out_shape}: first half", columns="ffn_gate")
        add("blk.{N}.ffn_up", gate_up, "columns", "second half", columns="ffn_up")
    else:
        if gate is not None:
            add("blk.{N}.ffn_gate", gate, "output", f"{leaf(gate.name)}: output {gate.out_shape}")
        if up is not None:
            add("blk.{N}.ffn_up", up, "output", f"{leaf(up.name)}: output {up.out_shape}")
        if gate is None and up is None:
            unplaced.append(f"ffn_gate/ffn_up: no projection named one of {GATE_NAMES + UP_NAMES} in {rel(mlp.name)}")
    if down is not None:
        add("blk.{N}.ffn_act", down, "input", f"{leaf(down.name)}'s input: the activation (x gate)")
        add("blk.{N}.ffn_out", down, "output", f"{leaf(down.name)}'s output")
    else:
        unplaced.append(f"ffn_act/ffn_out: no down projection named one of {DOWN_NAMES} in {rel(mlp.name)}")
    if post_ffn:
        add("blk.{N}.ffn_post_norm", post_ffn, "output", f"{post_ffn.cls}: its input is the MLP's output")
    rows.append(("blk.{N}.out", pat, "output", {}, "the decoder layer's output (the residual stream)"))
    # --- head and tail -------------------------------------------------------------------------------------------
    embeds = [c for c in calls if c.cls == "Embedding" or c.cls.endswith("Embedding") and "Rotary" not in c.cls]
    emb = next((c for c in embeds if same(c.out, layer.inp)), None)
    head = []
    if emb is not None:
        head.append(("embed", emb.name, "output", {}, f"{emb.cls}: its output is the first layer's input bit for bit"))
    else:
        first = embeds[0].name if embeds else "?"
        head.append(("embed", f"{stack}.0", "input", {"describe": f"{stack}.0 input (the first layer's input)"},
                     f"the first layer's input: {first}'s output is not it (a multiplier, positions or dropout between)"))
    lm = next((c for c in calls if leaf(c.name) in ("lm_head", "embed_out", "output")), None)
    last_layer = by_name.get(f"{stack}.{n_layer - 1}")
    top_norms = [c for c in calls if re.search(r"norm", c.cls, re.I) and not c.name.startswith(stack + ".")
                 and last_layer is not None and c.order > last_layer.order]
    tail = []
    if top_norms:
        tail.append(("output_norm", top_norms[0].name, "output", {}, f"{top_norms[0].cls} called after the last layer"))
    else:
        unplaced.append("output_norm: no norm is called after the last layer")
    about = ""
    if lm is None:
        unplaced.append("logits: no lm_head module")
    elif same(lm.out[0] if lm.out is not None else None, logits):
        tail.append(("logits", lm.name, "output", {}, "lm_head's output is the model's output logits bit for bit"))
    else:
        tail.append(("logits", lm.name, "logits_result",
                     {"describe": f"{type(model).__name__}.forward output .logits (lm_head, then what forward applies after it)"},
                     "the model's output logits differ from lm_head's output (a soft-cap or scaling after lm_head): read the output"))
        about = (f"model_output = the model's forward output ({type(model).__name__} changes the logits after lm_head, so "
                 "they are read there).")
    rows = head + rows + tail
    mt = cfg.model_type
    out = [
        f"# stage map PROPOSED by propose_stage_map.py for {type(model).__name__} (model_type {mt}) from {hf_dir.name}:",
        f"# the module tree and one traced forward of the model built by {how}.",
        "# Confirm every row (README \"Stage maps\"), then keep it as stage_maps/<model_type>.toml.",
        f"model_type = {json.dumps(mt)}",
        'class = "AutoModelForCausalLM"',
        "# qk_layout: \"hf\" keeps transformers' rotate_half layout of Q/K; \"llama_gguf\" if the goldens must match an",
        "# engine holding GGUF's permuted Q/K rows (llama.cpp's converter permutes the llama family's Q/K).",
        'qk_layout = "hf"',
    ]
    if about:
        out.append(f"about = {json.dumps(about)}")
    for cid, module, hook, opts, comment in rows:
        out += ["", f"# {comment}", "[[stage]]", f"id = {json.dumps(cid)}", f"module = {json.dumps(module)}",
                f"hook = {json.dumps(hook)}"]
        for key, val in opts.items():
            out.append(f"{key} = {json.dumps(val) if not isinstance(val, bool) else str(val).lower()}")
    if unplaced:
        out += ["", "# NOT PLACED (check by hand):"] + [f"# - {u}" for u in unplaced]
    return "\n".join(out) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hf-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, help="write the proposal here (default: print it)")
    ap.add_argument("--tokens", type=int, default=5, help="token ids traced (1..N)")
    ap.add_argument("--compare", type=Path, help="a stage map to diff the proposal against (rows: id, module, hook, "
                    "columns, heads_first, fallback; in order)")
    args = ap.parse_args()
    if not (args.hf_dir / "config.json").is_file():
        raise SystemExit(f"{args.hf_dir}: no config.json")
    model, how = build(args.hf_dir)
    calls, attn_in, logits = trace(model, args.tokens)
    text = propose(model, calls, attn_in, logits, how, args.hf_dir)
    if args.out:
        args.out.write_text(text)
        C.read_stage_map(args.out)
        print(f"wrote {args.out}")
    else:
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(text)
        C.read_stage_map(Path(f.name))
        Path(f.name).unlink()
        print(text, end="")
    if args.compare:
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
            f.write(text)
        prop, ref = C.read_stage_map(Path(f.name)), C.read_stage_map(args.compare)
        Path(f.name).unlink()

        def key(s):
            return (s.id, s.module, s.hook, s.columns, s.heads_first, s.fallback)

        p_rows, r_rows = [key(s) for s in prop.stages], [key(s) for s in ref.stages]
        both = [r for r in p_rows if r in r_rows]
        same_order = both == [r for r in r_rows if r in p_rows]
        print(f"# vs {args.compare}: {len(r_rows)} rows there, {len(p_rows)} proposed, {len(both)} identical, order "
              f"{'the same' if same_order else 'DIFFERENT'}; qk_layout {prop.qk_layout} / {ref.qk_layout}", file=sys.stderr)
        for r in r_rows:
            if r not in p_rows:
                print(f"#   only in {args.compare.name}: {r}", file=sys.stderr)
        for r in p_rows:
            if r not in r_rows:
                print(f"#   only proposed: {r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
