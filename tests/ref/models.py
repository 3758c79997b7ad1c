"""Independent PyTorch implementations of the worker's four architectures (docs/worker-model.md).

Written from the document only, with torch.nn.functional, as the oracle for the C trainer: run in
float64 they are exact to ~1e-15, so any difference larger than fp32 rounding is the C code's.

    spec = Spec.from_meta(model_json_dict, params)       # params: {full tensor name: array}
    logits, loss = forward(spec, P, batch)               # P: {name: torch tensor}

`batch` is {"inputs": [B,T] long, "targets": [B,T] long} (GPT, Llama, BERT) or
{"images": [B,C,S,S] float, "labels": [B] long} (ViT). Parameters are named exactly as in the
dumps: `embedding.wte`, `block.0.attn.qkv.weight`, `head.ln_f.weight`, ... Tied heads (GPT, BERT)
use the embedding's table, so its gradient sums both uses.
"""
import math

import needs  # noqa: E402
needs.modules("torch")
import torch
import torch.nn.functional as F

ARCHS = ("gpt", "llama", "bert", "vit")
NORM_EPS = {"gpt": 1e-5, "llama": 1e-5, "bert": 1e-12, "vit": 1e-6}
ROPE_THETA = 10000.0
RESIDUAL_OUT = ("attn.proj.weight", "mlp.proj.weight", "attn.o.weight", "mlp.down.weight")

# Accepted spellings of the model-spec fields in the `cephalo.model` metadata (first one wins).
_ALIASES = {
    "arch": ("arch", "architecture", "family"),
    "n_layer": ("n_layer", "layers", "n_layers", "num_layers"),
    "d_model": ("d_model", "d", "hidden", "hidden_size", "n_embd"),
    "n_head": ("n_head", "heads", "n_heads", "num_heads"),
    "n_kv_head": ("n_kv_head", "kv_heads", "n_kv_heads", "num_kv_heads"),
    "d_ff": ("d_ff", "ff", "ffn", "intermediate_size"),
    "vocab": ("vocab", "vocab_size"),
    "max_seq": ("max_seq", "max_position", "n_positions"),
    "type_vocab": ("type_vocab", "type_vocab_size"),
    "tied_head": ("tied_head", "tied", "tie_embeddings"),
    "image": ("image", "image_size"),
    "patch": ("patch", "patch_size"),
    "channels": ("channels", "num_channels"),
    "n_classes": ("n_classes", "classes", "num_classes"),
    "seq": ("seq", "seq_len", "default_seq"),
}


def _get(meta, field):
    for k in _ALIASES[field]:
        if k in meta and meta[k] is not None:
            return meta[k]
    return None


class Spec:
    """The model shape. Fields as in planner/model.h; values from the metadata, cross-checked
    against (and, where missing, derived from) the parameter shapes."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __repr__(self):
        return "Spec(%s)" % ", ".join("%s=%r" % kv for kv in sorted(self.__dict__.items()))

    @staticmethod
    def from_meta(meta, params):
        """meta: dict from the `cephalo.model` JSON (may be empty); params: {name: array}.
        Returns (spec, notes) where notes lists the fields that were derived or assumed."""
        meta = meta or {}
        notes = []
        names = set(params)
        arch = _get(meta, "arch")
        if isinstance(arch, int):
            arch = ARCHS[arch]
        if isinstance(arch, str):
            arch = arch.lower()
            for a in ARCHS:  # "gpt2" -> gpt, "ARCH_LLAMA" -> llama
                if a in arch:
                    arch = a
                    break
        derived = ("gpt" if "embedding.wte" in names else "llama" if "embedding.tokens" in names
                   else "bert" if "embedding.word" in names else "vit" if "embedding.patch.weight" in names
                   else None)
        if arch not in ARCHS:
            notes.append("arch %r not in the metadata: derived %r from the tensor names" % (arch, derived))
            arch = derived
        if arch is None:
            raise ValueError("cannot tell the architecture from the metadata or the tensor names")
        s = Spec(arch=arch)
        s.n_layer = sum(1 for n in names if n.startswith("block.") and n.endswith(
            "attn.qkv.weight"))
        if _get(meta, "n_layer") is not None and int(_get(meta, "n_layer")) != s.n_layer:
            raise ValueError("metadata n_layer %s but %d blocks in the file" % (_get(meta, "n_layer"), s.n_layer))
        qkv = params["block.0.attn.qkv.weight"].shape
        s.d_model = int(qkv[1])
        s.n_head = _get(meta, "n_head")
        if s.n_head is None:
            raise ValueError("metadata lacks n_head (the head count cannot be derived from shapes)")
        s.n_head = int(s.n_head)
        hd = s.d_model // s.n_head
        s.head_dim = hd
        kv_rows = int(qkv[0]) - s.d_model
        s.n_kv_head = kv_rows // (2 * hd)
        if _get(meta, "n_kv_head") is not None and int(_get(meta, "n_kv_head")) != s.n_kv_head:
            raise ValueError("metadata n_kv_head %s but qkv rows say %d" % (_get(meta, "n_kv_head"), s.n_kv_head))
        ff_name = "block.0.mlp.up.weight" if arch == "llama" else "block.0.mlp.fc.weight"
        s.d_ff = int(params[ff_name].shape[0])
        # an imported model's config.json may set these (docs/import.md); absent: the defaults
        s.eps = float(meta.get("norm_eps") or NORM_EPS[arch])
        s.rope_theta = float(meta.get("rope_theta") or ROPE_THETA)
        s.rope_scaling = meta.get("rope_scaling")  # config.json's form (Llama-3.1: llama3; linear)
        s.qkv_bias = arch == "llama" and "block.0.attn.qkv.bias" in names  # Qwen2
        if bool(meta.get("qkv_bias")) != s.qkv_bias and arch == "llama":
            raise ValueError("metadata qkv_bias %s but block.0.attn.qkv.bias is %s" % (
                meta.get("qkv_bias"), "present" if s.qkv_bias else "absent"))
        s.causal = arch in ("gpt", "llama")
        s.tied_head = arch in ("gpt", "bert") or (arch == "llama" and "head.lm_head.weight" not in names)
        if arch == "llama" and _get(meta, "tied_head") is not None and bool(_get(meta, "tied_head")) != s.tied_head:
            raise ValueError("metadata tied_head %s but head.lm_head.weight is %s" % (
                _get(meta, "tied_head"), "absent" if s.tied_head else "present"))
        if arch == "gpt":
            s.vocab, s.max_seq = int(params["embedding.wte"].shape[0]), int(params["embedding.wpe"].shape[0])
        elif arch == "llama":
            s.vocab = int(params["embedding.tokens"].shape[0])
            s.max_seq = int(_get(meta, "max_seq") or 0)
        elif arch == "bert":
            s.vocab, s.max_seq = int(params["embedding.word"].shape[0]), int(params["embedding.position"].shape[0])
            s.type_vocab = int(params["embedding.token_type"].shape[0])
        else:
            s.n_classes = int(params["head.classifier.weight"].shape[0])
            cpp = int(params["embedding.patch.weight"].shape[1])
            n_pos = int(params["embedding.pos"].shape[0])
            s.channels = int(_get(meta, "channels") or 3)
            s.patch = _get(meta, "patch")
            if s.patch is None:
                s.patch = int(round(math.sqrt(cpp / s.channels)))
                notes.append("patch derived from patch.weight: %d" % s.patch)
            s.patch = int(s.patch)
            s.image = _get(meta, "image")
            if s.image is None:
                s.image = int(round(math.sqrt(n_pos - 1))) * s.patch
                notes.append("image derived from pos: %d" % s.image)
            s.image = int(s.image)
            if s.channels * s.patch * s.patch != cpp or (s.image // s.patch) ** 2 + 1 != n_pos:
                raise ValueError("ViT metadata (channels %d, patch %d, image %d) disagrees with patch.weight %s / pos %s"
                                 % (s.channels, s.patch, s.image, params["embedding.patch.weight"].shape,
                                    params["embedding.pos"].shape))
        for f in ("vocab", "d_ff", "max_seq", "type_vocab", "n_classes"):
            mv = _get(meta, f)
            if mv is not None and hasattr(s, f) and int(mv) != getattr(s, f) and not (f == "max_seq" and arch == "llama"):
                raise ValueError("metadata %s %s but the tensors say %d" % (f, mv, getattr(s, f)))
        return s, notes


def layout(s):
    """The dump's tensors in buffer order per unit, as [(full name, shape)] (the doc's table)."""
    d, ff, L = s.d_model, s.d_ff, s.n_layer
    out = []
    if s.arch == "gpt":
        out += [("embedding.wte", (s.vocab, d)), ("embedding.wpe", (s.max_seq, d))]
    elif s.arch == "llama":
        out += [("embedding.tokens", (s.vocab, d))]
    elif s.arch == "bert":
        out += [("embedding.word", (s.vocab, d)), ("embedding.position", (s.max_seq, d)),
                ("embedding.token_type", (s.type_vocab, d)), ("embedding.ln.weight", (d,)),
                ("embedding.ln.bias", (d,))]
    else:
        P = (s.image // s.patch) ** 2
        out += [("embedding.patch.weight", (d, s.channels * s.patch * s.patch)),
                ("embedding.patch.bias", (d,)), ("embedding.cls", (d,)), ("embedding.pos", (P + 1, d))]
    for l in range(L):
        b = "block.%d." % l
        if s.arch == "llama":
            hd = s.head_dim
            qkv = (s.n_head + 2 * s.n_kv_head) * hd
            t = [("attn_norm.weight", (d,)), ("attn.qkv.weight", (qkv, d))]
            t += [("attn.qkv.bias", (qkv,))] if getattr(s, "qkv_bias", False) else []
            t += [("attn.o.weight", (d, d)), ("mlp_norm.weight", (d,)), ("mlp.gate.weight", (ff, d)),
                 ("mlp.up.weight", (ff, d)), ("mlp.down.weight", (d, ff))]
        else:
            attn = [("attn.qkv.weight", (3 * d, d)), ("attn.qkv.bias", (3 * d,)),
                    ("attn.proj.weight", (d, d)), ("attn.proj.bias", (d,))]
            mlp = [("mlp.fc.weight", (ff, d)), ("mlp.fc.bias", (ff,)), ("mlp.proj.weight", (d, ff)),
                   ("mlp.proj.bias", (d,))]
            ln1 = [("ln_1.weight", (d,)), ("ln_1.bias", (d,))]
            ln2 = [("ln_2.weight", (d,)), ("ln_2.bias", (d,))]
            t = attn + ln1 + mlp + ln2 if s.arch == "bert" else ln1 + attn + ln2 + mlp
        out += [(b + n, sh) for n, sh in t]
    if s.arch == "gpt":
        out += [("head.ln_f.weight", (d,)), ("head.ln_f.bias", (d,))]
    elif s.arch == "llama":
        out += [("head.norm.weight", (d,))] + ([] if s.tied_head else [("head.lm_head.weight", (s.vocab, d))])
    elif s.arch == "bert":
        out += [("head.transform.weight", (d, d)), ("head.transform.bias", (d,)), ("head.ln.weight", (d,)),
                ("head.ln.bias", (d,)), ("head.decoder.bias", (s.vocab,))]
    else:
        out += [("head.ln.weight", (d,)), ("head.ln.bias", (d,)), ("head.classifier.weight", (s.n_classes, d)),
                ("head.classifier.bias", (s.n_classes,))]
    return out


def init_params(s, gen, dtype=torch.float64):
    """Random parameters with the doc's distributions (not its counter-based generator: tests)."""
    out = {}
    for name, shape in layout(s):
        if name.endswith("norm.weight") or (".ln" in name and name.endswith(".weight")):
            t = torch.ones(shape, dtype=dtype)
        elif name.endswith(".bias"):
            t = torch.zeros(shape, dtype=dtype)
        else:
            std = 0.02 / math.sqrt(2 * s.n_layer) if name.endswith(RESIDUAL_OUT) else 0.02
            t = torch.randn(shape, generator=gen, dtype=dtype) * std
        out[name] = t
    return out


# ---- building blocks ----

def _rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rope(T, hd, dtype, theta=ROPE_THETA, scaling=None):
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    kind = (scaling or {}).get("rope_type", "none")
    if kind == "linear":  # transformers: positions (so frequencies) / factor
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":  # transformers' _compute_llama3_parameters, by wavelength
        f, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wl = 2 * math.pi / inv_freq
        smooth = ((old / wl - lo) / (hi - lo)).clamp(0, 1)  # 0: long waves (/ f), 1: short (kept)
        inv_freq = torch.where(wl < old / hi, inv_freq, torch.where(wl > old / lo, inv_freq / f,
                                                                     (1 - smooth) * inv_freq / f + smooth * inv_freq))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _attention(s, qkv, rope=False):
    """qkv [B,T,(H+2Hkv)*hd] with columns [q heads | k heads | v heads] -> [B,T,H*hd]."""
    B, T, _ = qkv.shape
    H, Hkv, hd = s.n_head, s.n_kv_head, s.head_dim
    q = qkv[..., : H * hd].reshape(B, T, H, hd).transpose(1, 2)
    k = qkv[..., H * hd : (H + Hkv) * hd].reshape(B, T, Hkv, hd).transpose(1, 2)
    v = qkv[..., (H + Hkv) * hd :].reshape(B, T, Hkv, hd).transpose(1, 2)
    if rope:
        cos, sin = _rope(T, hd, qkv.dtype, getattr(s, "rope_theta", ROPE_THETA), getattr(s, "rope_scaling", None))
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
    if Hkv != H:  # query head h uses kv head h // (H / Hkv)
        k = k.repeat_interleave(H // Hkv, dim=1)
        v = v.repeat_interleave(H // Hkv, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if s.causal:
        allowed = torch.ones(T, T, dtype=torch.bool).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    return (p @ v).transpose(1, 2).reshape(B, T, H * hd)


def _ln(x, P, prefix, eps):
    return F.layer_norm(x, (x.shape[-1],), P[prefix + ".weight"], P[prefix + ".bias"], eps)


def _lin(x, P, prefix, bias=True):
    return F.linear(x, P[prefix + ".weight"], P[prefix + ".bias"] if bias else None)


def lm_loss(logits, targets, mean="samples"):
    """Per sample: mean cross-entropy over its targets (< 0 ignored); then mean over samples.
    mean="targets" (loss-masked fine-tuning data): the mean over all the batch's targets."""
    B, T, V = logits.shape
    valid = targets >= 0
    ce = F.cross_entropy(logits.reshape(B * T, V), targets.clamp(min=0).reshape(B * T),
                         reduction="none").reshape(B, T)
    ce = torch.where(valid, ce, torch.zeros_like(ce))
    if mean == "targets":
        return ce.sum() / valid.sum().clamp(min=1).to(ce.dtype)
    per_sample = ce.sum(1) / valid.sum(1).clamp(min=1).to(ce.dtype)
    return per_sample.mean()


# ---- the four architectures ----

def _gpt(s, P, ids):
    T = ids.shape[1]
    x = P["embedding.wte"][ids] + P["embedding.wpe"][:T]
    for l in range(s.n_layer):
        b = "block.%d." % l
        h = _ln(x, P, b + "ln_1", s.eps)
        x = x + _lin(_attention(s, _lin(h, P, b + "attn.qkv")), P, b + "attn.proj")
        h = _ln(x, P, b + "ln_2", s.eps)
        x = x + _lin(F.gelu(_lin(h, P, b + "mlp.fc"), approximate="tanh"), P, b + "mlp.proj")
    x = _ln(x, P, "head.ln_f", s.eps)
    return x @ P["embedding.wte"].t()


def _llama(s, P, ids):
    x = P["embedding.tokens"][ids]
    for l in range(s.n_layer):
        b = "block.%d." % l
        h = _rms_norm(x, P[b + "attn_norm.weight"], s.eps)
        qkv = F.linear(h, P[b + "attn.qkv.weight"], P.get(b + "attn.qkv.bias"))  # bias: Qwen2
        x = x + F.linear(_attention(s, qkv, rope=True), P[b + "attn.o.weight"])
        h = _rms_norm(x, P[b + "mlp_norm.weight"], s.eps)
        g = F.silu(F.linear(h, P[b + "mlp.gate.weight"])) * F.linear(h, P[b + "mlp.up.weight"])
        x = x + F.linear(g, P[b + "mlp.down.weight"])
    x = _rms_norm(x, P["head.norm.weight"], s.eps)
    return F.linear(x, P["embedding.tokens"] if s.tied_head else P["head.lm_head.weight"])


def _bert(s, P, ids):
    T = ids.shape[1]
    x = P["embedding.word"][ids] + P["embedding.position"][:T] + P["embedding.token_type"][0]
    x = _ln(x, P, "embedding.ln", s.eps)
    for l in range(s.n_layer):
        b = "block.%d." % l
        x = _ln(x + _lin(_attention(s, _lin(x, P, b + "attn.qkv")), P, b + "attn.proj"), P, b + "ln_1", s.eps)
        x = _ln(x + _lin(F.gelu(_lin(x, P, b + "mlp.fc")), P, b + "mlp.proj"), P, b + "ln_2", s.eps)
    h = _ln(F.gelu(_lin(x, P, "head.transform")), P, "head.ln", s.eps)
    return h @ P["embedding.word"].t() + P["head.decoder.bias"]


def _vit(s, P, images):
    B, d, p = images.shape[0], s.d_model, s.patch
    w = P["embedding.patch.weight"].reshape(d, s.channels, p, p)  # flattened as (c, py, px)
    x = F.conv2d(images, w, P["embedding.patch.bias"], stride=p)  # [B, d, S/p, S/p]
    x = x.flatten(2).transpose(1, 2)  # patches in raster order (row, then column)
    x = torch.cat((P["embedding.cls"].expand(B, 1, d), x), dim=1) + P["embedding.pos"]
    for l in range(s.n_layer):
        b = "block.%d." % l
        h = _ln(x, P, b + "ln_1", s.eps)
        x = x + _lin(_attention(s, _lin(h, P, b + "attn.qkv")), P, b + "attn.proj")
        h = _ln(x, P, b + "ln_2", s.eps)
        x = x + _lin(F.gelu(_lin(h, P, b + "mlp.fc")), P, b + "mlp.proj")
    return _lin(_ln(x[:, 0], P, "head.ln", s.eps), P, "head.classifier")


def forward(s, P, batch):
    """Returns (logits, loss): logits [B,T,V] (ViT [B,classes]); loss as in the doc."""
    if s.arch == "vit":
        logits = _vit(s, P, batch["images"])
        return logits, F.cross_entropy(logits, batch["labels"])
    fn = {"gpt": _gpt, "llama": _llama, "bert": _bert}[s.arch]
    logits = fn(s, P, batch["inputs"])
    return logits, lm_loss(logits, batch["targets"], batch.get("loss_mean", "samples"))


def zero_grad_slices(s):
    """Parameter elements that have no effect on the outputs: the key part of every fused qkv
    bias (softmax is invariant to adding q·b_k to a whole row of scores). Their exact gradient is
    0, so an fp32 trainer's value is pure rounding noise. {name: slice}."""
    if s.arch == "llama":
        return {}
    d = s.d_model
    return {"block.%d.attn.qkv.bias" % l: slice(d, 2 * d) for l in range(s.n_layer)}
