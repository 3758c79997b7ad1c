"""Small random Hugging Face model directories, and the transformers-style forward on them, for
the import tests (tests/cli/test_import.sh, docs/import.md).

usage: hf_models.py make DIR --arch gpt2|llama|mistral|qwen2 [--dtype f32|bf16|f16] [--shards N]
                         [--tied] [--rope-theta X] [--rope-scaling linear|llama3] [--factor X]
                         [--orig N] [--window N] [--eps X] [--layers N] [--d N] [--heads N]
                         [--kv N] [--ff N] [--vocab N] [--positions N] [--seed N] [--std X]
                         [--format safetensors|bin]
       hf_models.py check DIR DUMP     step 0's logits in DUMP (cephalo-worker train --dump) vs the
                                       forward on DIR's files in float64; "ok - ..." / "not ok - ..."

`make` writes config.json and model.safetensors, or with --shards N > 1 the files
model-0000K-of-0000N.safetensors and model.safetensors.index.json, laid out as transformers'
save_pretrained does (--format bin: torch.save's pytorch_model.bin, or pytorch_model-0000K-of-
0000N.bin and pytorch_model.bin.index.json, with some tensors saved as strided views: q_proj
transposed twice, v_proj a slice of a larger storage) (GPT-2 names under "transformer.", Conv1D weights [in, out]; Llama's
q/k/v/o projections [out, in]). Values are random normals, rounded to the file's dtype, so the
forward reads exactly what the worker reads. mistral and qwen2 are Llama's layout with their own
config.json (Mistral: sliding_window --window, null by default; Qwen2: q/k/v biases,
use_sliding_window false); --rope-scaling writes a rope_scaling of that type (llama3: factor
--factor, low/high_freq_factor 1 and 4, original_max_position_embeddings --orig, as Llama-3.1
has them scaled down to these small models).

Python: Debian's /usr/bin/python3 with python3-numpy and python3-torch (`make deps`), as the tests
run it; under an interpreter without them it says so (needs.py).
"""
import argparse
import json
import os
import struct
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import needs  # noqa: E402
needs.modules("numpy", "torch")
import numpy as np  # noqa: E402
import torch  # noqa: E402

import check_export  # noqa: E402
import st  # noqa: E402


def gpt2_tensors(a, rng):
    d, ff, V, P = a.d, a.ff or 4 * a.d, a.vocab, a.positions
    n = lambda *s: rng.normal(0, a.std, s)  # noqa: E731
    W = {"transformer.wte.weight": n(V, d), "transformer.wpe.weight": n(P, d)}
    for i in range(a.layers):
        p = "transformer.h.%d." % i
        W.update({p + "ln_1.weight": 1 + n(d), p + "ln_1.bias": n(d),
                  p + "attn.c_attn.weight": n(d, 3 * d), p + "attn.c_attn.bias": n(3 * d),
                  p + "attn.c_proj.weight": n(d, d), p + "attn.c_proj.bias": n(d),
                  p + "ln_2.weight": 1 + n(d), p + "ln_2.bias": n(d),
                  p + "mlp.c_fc.weight": n(d, ff), p + "mlp.c_fc.bias": n(ff),
                  p + "mlp.c_proj.weight": n(ff, d), p + "mlp.c_proj.bias": n(d)})
    W.update({"transformer.ln_f.weight": 1 + n(d), "transformer.ln_f.bias": n(d)})
    cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_embd": d,
           "n_head": a.heads, "n_layer": a.layers, "n_positions": P, "n_ctx": P, "n_inner": a.ff or None,
           "activation_function": "gelu_new", "layer_norm_epsilon": a.eps or 1e-5,
           "torch_dtype": {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[a.dtype]}
    return W, cfg


def llama_tensors(a, rng):
    """LlamaForCausalLM, or on its layout MistralForCausalLM or Qwen2ForCausalLM."""
    d, ff, V, H = a.d, a.ff or 3 * a.d, a.vocab, a.heads
    kv = a.kv or H
    hd = d // H
    n = lambda *s: rng.normal(0, a.std, s)  # noqa: E731
    W = {"model.embed_tokens.weight": n(V, d)}
    for i in range(a.layers):
        p = "model.layers.%d." % i
        W.update({p + "input_layernorm.weight": 1 + n(d), p + "self_attn.q_proj.weight": n(H * hd, d),
                  p + "self_attn.k_proj.weight": n(kv * hd, d), p + "self_attn.v_proj.weight": n(kv * hd, d),
                  p + "self_attn.o_proj.weight": n(d, d), p + "post_attention_layernorm.weight": 1 + n(d),
                  p + "mlp.gate_proj.weight": n(ff, d), p + "mlp.up_proj.weight": n(ff, d),
                  p + "mlp.down_proj.weight": n(d, ff)})
        if a.arch == "qwen2":
            W.update({p + "self_attn.q_proj.bias": n(H * hd), p + "self_attn.k_proj.bias": n(kv * hd),
                      p + "self_attn.v_proj.bias": n(kv * hd)})
    W["model.norm.weight"] = 1 + n(d)
    if not a.tied:
        W["lm_head.weight"] = n(V, d)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": d,
           "intermediate_size": ff, "num_attention_heads": H, "num_key_value_heads": kv,
           "num_hidden_layers": a.layers, "max_position_embeddings": a.positions,
           "rms_norm_eps": a.eps or 1e-6, "rope_theta": a.rope_theta, "hidden_act": "silu",
           "tie_word_embeddings": bool(a.tied), "rope_scaling": None, "attention_bias": False,
           "torch_dtype": {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}[a.dtype]}
    if a.rope_scaling == "linear":
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": a.factor}
    elif a.rope_scaling == "llama3":
        cfg["rope_scaling"] = {"rope_type": "llama3", "factor": a.factor, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": a.orig}
    if a.arch == "mistral":
        cfg.update({"architectures": ["MistralForCausalLM"], "model_type": "mistral", "sliding_window": a.window})
        del cfg["attention_bias"]
    elif a.arch == "qwen2":
        cfg.update({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "use_sliding_window": False,
                    "sliding_window": 4 * a.positions, "max_window_layers": a.layers})
        del cfg["attention_bias"]
    return W, cfg


def encode(x, dtype):
    """(safetensors dtype name, little-endian bytes) of a float64 array in the file's dtype."""
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    if dtype == "f32":
        return "F32", x32.astype("<f4").tobytes()
    if dtype == "f16":
        return "F16", x32.astype("<f2").tobytes()
    u = x32.view(np.uint32).astype(np.uint64)  # bf16: round to nearest even
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    return "BF16", u.tobytes()


def write_st(path, tensors, dtype):
    """A safetensors file as other writers make it: no cephalo.crc32, only the format metadata."""
    header, chunks, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, x in tensors.items():
        dt, raw = encode(x, dtype)
        header[name] = {"dtype": dt, "shape": list(x.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    hb = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        f.write(b"".join(chunks))


TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def write_bin(path, tensors, dtype):
    """A state dict as torch.save writes one (an OrderedDict of tensors, zip format). Some tensors
    are saved as the views a module's state can hold: q_proj a transposed view of its transpose
    (strided), v_proj rows 1.. of a larger tensor (a storage offset); values as write_st's."""
    import collections
    sd = collections.OrderedDict()
    for name, x in tensors.items():
        t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(TORCH_DTYPES[dtype])
        if "q_proj.weight" in name:
            t = t.t().contiguous().t()
        elif "v_proj.weight" in name:
            t = torch.cat([torch.zeros_like(t[:1]), t])[1:]
        sd[name] = t
    torch.save(sd, path)


def make(a):
    rng = np.random.default_rng(a.seed)
    W, cfg = (gpt2_tensors if a.arch == "gpt2" else llama_tensors)(a, rng)
    os.makedirs(a.dir, exist_ok=True)
    with open(os.path.join(a.dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    names = list(W)
    bin_ = a.format == "bin"
    write = write_bin if bin_ else write_st
    if a.shards <= 1:
        write(os.path.join(a.dir, "pytorch_model.bin" if bin_ else "model.safetensors"), W, a.dtype)
        return
    weight_map = {}
    for k in range(a.shards):  # consecutive runs of tensors per shard, as save_pretrained
        part = names[k * len(names) // a.shards:(k + 1) * len(names) // a.shards]
        fname = ("pytorch_model-%05d-of-%05d.bin" if bin_ else "model-%05d-of-%05d.safetensors") % (k + 1, a.shards)
        write(os.path.join(a.dir, fname), {n: W[n] for n in part}, a.dtype)
        weight_map.update({n: fname for n in part})
    with open(os.path.join(a.dir, "pytorch_model.bin.index.json" if bin_ else "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f, indent=2)


def load(d):
    """config.json and every tensor of the directory (single file or sharded), as float64."""
    cfg = json.load(open(os.path.join(d, "config.json")))
    bin_ = not any(os.path.exists(os.path.join(d, f)) for f in ("model.safetensors", "model.safetensors.index.json"))
    index = os.path.join(d, "pytorch_model.bin.index.json" if bin_ else "model.safetensors.index.json")
    files = (sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index)
             else ["pytorch_model.bin" if bin_ else "model.safetensors"])
    W = {}
    for fname in files:
        if bin_:  # our own files: torch.load is the reference reader here
            W.update({k: v.double() for k, v in torch.load(os.path.join(d, fname)).items()})
            continue
        t, _ = st.read(os.path.join(d, fname))
        W.update({k: torch.from_numpy(np.asarray(v, dtype=np.float64)) for k, v in t.items()})
    cfg.setdefault("rope_theta", 10000.0)
    cfg.setdefault("rms_norm_eps", 1e-6)
    cfg.setdefault("layer_norm_epsilon", 1e-5)
    cfg.setdefault("num_key_value_heads", cfg.get("num_attention_heads"))
    return cfg, W


def check(hf_dir, dump):
    cfg, W = load(hf_dir)
    batches, _ = st.read(os.path.join(dump, "batches.safetensors"))
    got, _ = st.read(os.path.join(dump, "step0.safetensors"))
    ids = torch.from_numpy(batches["step0.inputs"]).long()
    fwd = check_export.gpt2 if cfg["model_type"] == "gpt2" else check_export.llama
    ref = fwd(cfg, W, ids)
    ours = torch.from_numpy(np.asarray(got["logits"], dtype=np.float64)).reshape(ref.shape)
    err = ((ours - ref).norm() / ref.norm()).item()
    what = "step-0 logits of %s = transformers-style forward on its files" % os.path.basename(hf_dir.rstrip("/"))
    ok = err <= 1e-5
    print("%s - %s (rel err %.2e, tol 1e-5)" % ("ok" if ok else "not ok", what, err))
    return 0 if ok else 1


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "check" and len(sys.argv) == 4:
        return check(sys.argv[2], sys.argv[3])
    p = argparse.ArgumentParser(usage=__doc__)
    p.add_argument("cmd", choices=["make"])
    p.add_argument("dir")
    p.add_argument("--arch", choices=["gpt2", "llama", "mistral", "qwen2"], required=True)
    p.add_argument("--rope-scaling", choices=["linear", "llama3"])
    p.add_argument("--factor", type=float, default=8.0)
    p.add_argument("--orig", type=int, default=32)
    p.add_argument("--window", type=int)
    p.add_argument("--format", choices=["safetensors", "bin"], default="safetensors")
    p.add_argument("--dtype", choices=["f32", "bf16", "f16"], default="f32")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--tied", action="store_true")
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--eps", type=float, default=0)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv", type=int, default=0)
    p.add_argument("--ff", type=int, default=0)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--positions", type=int, default=128)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--std", type=float, default=0.1)
    make(p.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
