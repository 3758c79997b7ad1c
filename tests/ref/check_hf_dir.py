"""Checks an exported model directory file by file and key by key against what Hugging Face
transformers reads when it loads one with AutoModelForCausalLM.from_pretrained and
AutoTokenizer.from_pretrained (written from transformers' documented formats; transformers is not
needed here: json and numpy only):

  config.json              architectures, model_type, vocab_size, the architecture's size keys
                           (GPT2Config: n_embd n_head n_layer n_positions layer_norm_epsilon;
                           LlamaConfig: hidden_size intermediate_size num_attention_heads
                           num_key_value_heads num_hidden_layers max_position_embeddings
                           rms_norm_eps rope_theta; MistralConfig and Qwen2Config the same,
                           with sliding_window / use_sliding_window false), torch_dtype,
                           bos_token_id, eos_token_id; rope_scaling null or one transformers
                           reads (linear: factor; llama3: its four keys)
  generation_config.json   bos_token_id, eos_token_id (GenerationConfig: generate() stops at EOS)
  model.safetensors        an 8-byte little-endian header length, a JSON header whose
                           __metadata__ has "format": "pt" (transformers refuses others), every
                           tensor in the dtype torch_dtype names, data_offsets tiling the data;
                           no *.safetensors.index.json nor other weight files beside it
  tokenizer.json           a tokenizers document: model (BPE) with vocab and merges, added_tokens
  tokenizer_config.json    tokenizer_class (a class AutoTokenizer knows), bos/eos/unk tokens,
                           model_max_length
  special_tokens_map.json  the same special tokens
and that the special tokens' ids agree everywhere (the token strings of tokenizer_config.json are
the ids of config.json and generation_config.json in tokenizer.json).

usage: check_hf_dir.py DIR [--eos TOKEN] [--no-tokenizer] [--like F32_DIR]
  --eos TOKEN      the end-of-text token the export must stop at (e.g. <|end_of_text|>)
  --no-tokenizer   the export has no tokenizer: none of the tokenizer files, null token ids
  --like F32_DIR   a float32 export of the same checkpoint: DIR's 16-bit tensors must be its
                   values rounded to nearest even (numpy, an independent rounding)
prints "ok - ..." / "not ok - ..." lines; exit 1 on any failure
"""
import json
import os
import struct
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import needs  # noqa: E402
needs.modules("numpy")
import numpy as np  # noqa: E402

fails = 0


def report(ok, what):
    global fails
    print(("ok - " if ok else "not ok - ") + what)
    if not ok:
        fails += 1


def load_json(d, name):
    with open(os.path.join(d, name), encoding="utf-8") as f:
        return json.load(f)


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


ST_DTYPE = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
# the classes AutoTokenizer maps a tokenizer_class to when only tokenizer.json is there
TOKENIZER_CLASSES = {"PreTrainedTokenizerFast", "GPT2TokenizerFast", "LlamaTokenizerFast", "GPT2Tokenizer",
                     "LlamaTokenizer"}
ARCH_KEYS = {
    "gpt2": ("GPT2LMHeadModel", ["n_embd", "n_head", "n_layer", "n_positions"], ["layer_norm_epsilon"]),
    "llama": ("LlamaForCausalLM", ["hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                                   "num_hidden_layers", "max_position_embeddings"], ["rms_norm_eps", "rope_theta"]),
}
ARCH_KEYS["mistral"] = ("MistralForCausalLM", ARCH_KEYS["llama"][1] + ["sliding_window"], ARCH_KEYS["llama"][2])
ARCH_KEYS["qwen2"] = ("Qwen2ForCausalLM",) + ARCH_KEYS["llama"][1:]
ROPE_KEYS = {"linear": ["factor"],
             "llama3": ["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    return header, raw[8 + n:]


def check_config(d):
    cfg = load_json(d, "config.json")
    mt = cfg.get("model_type")
    report(mt in ARCH_KEYS, "config.json: model_type %r is gpt2, llama, mistral or qwen2" % mt)
    if mt not in ARCH_KEYS:
        return cfg
    arch, ints, floats = ARCH_KEYS[mt]
    report(cfg.get("architectures") == [arch], "config.json: architectures is [%s]" % arch)
    report(is_int(cfg.get("vocab_size")) and cfg["vocab_size"] > 0, "config.json: vocab_size is a positive int")
    bad = [k for k in ints if not (is_int(cfg.get(k)) and cfg[k] > 0)]
    bad += [k for k in floats if not isinstance(cfg.get(k), (int, float)) or cfg[k] <= 0]
    report(not bad, "config.json: %s's size keys present%s" % (mt, " (missing or bad: %s)" % bad if bad else ""))
    if mt == "qwen2":
        report(cfg.get("use_sliding_window") is False, "config.json: qwen2's use_sliding_window is false")
    rs = cfg.get("rope_scaling")
    if mt != "gpt2" and rs is not None:
        keys = ROPE_KEYS.get(rs.get("rope_type"), [None])
        report(all(isinstance(rs.get(k), (int, float)) and rs[k] > 0 for k in keys),
               "config.json: rope_scaling %r has the keys transformers reads for its rope_type" % rs)
    report(cfg.get("torch_dtype") in ST_DTYPE, "config.json: torch_dtype %r is float32, bfloat16 or float16" %
           cfg.get("torch_dtype"))
    return cfg


def check_weights(d, cfg):
    header, data = read_safetensors(os.path.join(d, "model.safetensors"))
    meta = header.pop("__metadata__", {})
    report(meta.get("format") == "pt", 'model.safetensors: __metadata__ "format" is "pt"')
    want = ST_DTYPE.get(cfg.get("torch_dtype"))
    bad = sorted(k for k, v in header.items() if v["dtype"] != want)
    report(not bad, "model.safetensors: every tensor is %s (torch_dtype %s)%s" %
           (want, cfg.get("torch_dtype"), (": not " + ", ".join(bad[:3])) if bad else ""))
    size = {"F32": 4, "BF16": 2, "F16": 2}
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k, v) for k, v in header.items())
    pos, tiled = 0, True
    for lo, hi, k, v in spans:
        n = int(np.prod(v["shape"])) if v["shape"] else 1
        tiled &= lo == pos and hi - lo == n * size.get(v["dtype"], 0)
        pos = hi
    report(tiled and pos == len(data), "model.safetensors: data_offsets tile the %d data bytes" % len(data))
    emb = "transformer.wte.weight" if cfg.get("model_type") == "gpt2" else "model.embed_tokens.weight"
    report(emb in header and header[emb]["shape"][0] == cfg.get("vocab_size"),
           "model.safetensors: %s has vocab_size rows" % emb)
    others = [f for f in os.listdir(d) if (f.endswith(".safetensors") and f != "model.safetensors")
              or f.endswith(".index.json") or f.startswith("pytorch_model")]
    report(not others, "no other weight files or index beside model.safetensors%s" % (": %s" % others if others else ""))
    return header, data


def tensor(header, data, name):
    v = header[name]
    lo, hi = v["data_offsets"]
    raw = np.frombuffer(data[lo:hi], dtype="<u2" if v["dtype"] in ("BF16", "F16") else "<f4")
    return v["dtype"], raw.reshape(v["shape"])


def round_bf16(x):
    u = x.astype("<f4").view("<u4").astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    return r


def check_like(d, cfg, header, data, f32_dir):
    h32, d32 = read_safetensors(os.path.join(f32_dir, "model.safetensors"))
    h32.pop("__metadata__", None)
    report(sorted(h32) == sorted(header), "--like: the same tensor names and shapes as the float32 export")
    worst = 0
    for k in h32:
        _, x = tensor(h32, d32, k)
        dt, y = tensor(header, data, k)
        want = round_bf16(x) if dt == "BF16" else x.astype(np.float16).view("<u2")
        worst += int(np.count_nonzero(want != y))
    report(worst == 0, "--like: every %s value is the float32 export's rounded to nearest even (%d differ)" %
           (cfg.get("torch_dtype"), worst))


def token_ids(tj):
    ids = dict(tj["model"]["vocab"])
    for a in tj.get("added_tokens") or []:
        ids[a["content"]] = a["id"]
    return ids


def check_tokenizer(d, cfg, eos_want):
    tj = load_json(d, "tokenizer.json")
    m = tj.get("model", {})
    report(m.get("type", "BPE") == "BPE" and isinstance(m.get("vocab"), dict) and isinstance(m.get("merges"), list),
           "tokenizer.json: model is BPE with vocab and merges")
    ids = token_ids(tj)
    report(max(ids.values()) < cfg["vocab_size"], "tokenizer.json: every id below config.json's vocab_size %d" %
           cfg["vocab_size"])
    tc = load_json(d, "tokenizer_config.json")
    report(tc.get("tokenizer_class") in TOKENIZER_CLASSES, "tokenizer_config.json: tokenizer_class %r is one "
           "AutoTokenizer loads from tokenizer.json" % tc.get("tokenizer_class"))
    report(is_int(tc.get("model_max_length")) and tc["model_max_length"] > 0,
           "tokenizer_config.json: model_max_length is a positive int")
    sm = load_json(d, "special_tokens_map.json")
    gc = load_json(d, "generation_config.json")
    for key in ("bos", "eos"):
        s = tc.get(key + "_token")
        report(isinstance(s, str) and s in ids, "tokenizer_config.json: %s_token %r is a token of tokenizer.json" %
               (key, s))
        report(sm.get(key + "_token") == s, "special_tokens_map.json: %s_token is tokenizer_config.json's" % key)
        tid = ids.get(s)
        report(cfg.get(key + "_token_id") == tid, "config.json: %s_token_id %r is %r's id %r" %
               (key, cfg.get(key + "_token_id"), s, tid))
        report(gc.get(key + "_token_id") == tid, "generation_config.json: %s_token_id %r is %r's id %r" %
               (key, gc.get(key + "_token_id"), s, tid))
    if "unk_token" in tc:
        report(tc["unk_token"] in ids and sm.get("unk_token") == tc["unk_token"],
               "tokenizer_config.json, special_tokens_map.json: unk_token %r is a token" % tc["unk_token"])
    if eos_want is not None:
        report(tc.get("eos_token") == eos_want and gc.get("eos_token_id") == ids.get(eos_want),
               "generation stops at %s (id %r)" % (eos_want, ids.get(eos_want)))


def main():
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        print(__doc__)
        return 2
    d, eos, no_tok, like = args[0], None, False, None
    i = 1
    while i < len(args):
        if args[i] == "--eos":
            eos, i = args[i + 1], i + 2
        elif args[i] == "--like":
            like, i = args[i + 1], i + 2
        elif args[i] == "--no-tokenizer":
            no_tok, i = True, i + 1
        else:
            print("unknown argument %s" % args[i])
            return 2
    cfg = check_config(d)
    header, data = check_weights(d, cfg)
    if like:
        check_like(d, cfg, header, data, like)
    tok_files = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    if no_tok:
        present = [f for f in tok_files if os.path.exists(os.path.join(d, f))]
        report(not present, "no tokenizer files%s" % (": %s" % present if present else ""))
        gc = load_json(d, "generation_config.json")
        report(cfg.get("eos_token_id") is None and gc.get("eos_token_id") is None,
               "without a tokenizer the EOS id is not set (no class default for another vocabulary)")
    else:
        check_tokenizer(d, cfg, eos)
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
