"""Checks `cephalo-worker export`: a forward pass written the way Hugging Face transformers
computes GPT2LMHeadModel (Conv1D weights [in, out], fused c_attn) and LlamaForCausalLM (separate
q/k/v projections, rotate-half RoPE), run on the exported model.safetensors + config.json, must
give the same logits as the oracle's model (tests/ref/models.py) on the checkpoint's parameters
(the dump's final.safetensors of the same run).

usage: check_export.py HF_DIR DUMP_DIR     prints "ok - ..." / "not ok - ..." lines
"""
import json
import math
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import needs  # noqa: E402
needs.modules("torch")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import models  # noqa: E402
import st  # noqa: E402


def causal_attention(q, k, v):
    T = q.shape[-2]
    att = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    att = att.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    return F.softmax(att, dim=-1) @ v


def gpt2(cfg, W, ids):
    B, T = ids.shape
    d, H = cfg["n_embd"], cfg["n_head"]
    eps = cfg["layer_norm_epsilon"]
    x = W["transformer.wte.weight"][ids] + W["transformer.wpe.weight"][:T]
    for i in range(cfg["n_layer"]):
        p = "transformer.h.%d." % i
        h = F.layer_norm(x, (d,), W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]  # Conv1D: x W + b
        q, k, v = (t.view(B, T, H, d // H).transpose(1, 2) for t in qkv.split(d, dim=2))
        a = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, d)
        x = x + a @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        h = F.layer_norm(x, (d,), W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        h = F.gelu(h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"], approximate="tanh")
        x = x + h @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (d,), W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], eps)
    return x @ W["transformer.wte.weight"].T


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_inv_freq(cfg, hd):
    """transformers' RoPE inverse frequencies (modeling_rope_utils: default, linear, llama3), in
    float64."""
    inv = 1.0 / (cfg.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "linear":
        return inv / rs["factor"]
    if kind == "llama3":
        factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / hi) * ~(wavelen > old / lo)
        return torch.where(medium, smoothed, scaled)
    assert kind == "default", kind
    return inv


def llama(cfg, W, ids):
    """LlamaForCausalLM, and its relatives on the same layout: MistralForCausalLM (no window
    within the sequence) and Qwen2ForCausalLM (q/k/v biases, when the files have them)."""
    B, T = ids.shape
    d, H, Hkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps = d // H, cfg["rms_norm_eps"]
    inv = rope_inv_freq(cfg, hd)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    x = W["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rms(x, W[p + "input_layernorm.weight"])
        proj = {n: F.linear(h, W[p + "self_attn.%s_proj.weight" % n], W.get(p + "self_attn.%s_proj.bias" % n))
                for n in "qkv"}
        q = proj["q"].view(B, T, H, hd).transpose(1, 2)
        k = proj["k"].view(B, T, Hkv, hd).transpose(1, 2)
        v = proj["v"].view(B, T, Hkv, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
        a = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, d)
        x = x + a @ W[p + "self_attn.o_proj.weight"].T
        h = rms(x, W[p + "post_attention_layernorm.weight"])
        g = F.silu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)
        x = x + g @ W[p + "mlp.down_proj.weight"].T
    # a tied head (tie_word_embeddings) has no lm_head of its own
    return rms(x, W["model.norm.weight"]) @ W.get("lm_head.weight", W["model.embed_tokens.weight"]).T


def main():
    hf_dir, dump = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    W, _ = st.read(os.path.join(hf_dir, "model.safetensors"))
    W = {k: torch.from_numpy(v).double() for k, v in W.items()}
    P, meta = st.read(os.path.join(dump, "final.safetensors"))
    batches, _ = st.read(os.path.join(dump, "batches.safetensors"))
    spec, _ = models.Spec.from_meta(json.loads(meta.get("cephalo.model", "{}")), P)
    P = {k: torch.from_numpy(v).double() for k, v in P.items()}
    ids = torch.from_numpy(batches["step0.inputs"]).long()
    ref, _ = models.forward(spec, P, {"inputs": ids, "targets": torch.from_numpy(batches["step0.targets"]).long()})
    ours = gpt2(cfg, W, ids) if cfg["model_type"] == "gpt2" else llama(cfg, W, ids)
    err = ((ours - ref).norm() / ref.norm()).item()
    what = "%s export: transformers-style forward on the exported weights" % cfg["model_type"]
    if err < 1e-6:
        print("ok - %s matches the oracle (rel err %.2e)" % (what, err))
    else:
        print("not ok - %s differs from the oracle (rel err %.2e)" % (what, err))
        sys.exit(1)


if __name__ == "__main__":
    main()
