#!/usr/bin/python3
"""The exported directory in Hugging Face transformers itself (run by tests/gpu/test_hf_roundtrip.sh
on a machine that has transformers and tokenizers; make test checks the files key by key without
them, tests/ref/check_hf_dir.py).

usage: hf_roundtrip.py EXPORT_DIR SAMPLE_JSON SAMPLE_DUMP TEXT_FILE SHARD [--bos]

  1. tokenizers.Tokenizer.from_file(EXPORT_DIR/tokenizer.json) and AutoTokenizer.from_pretrained(
     EXPORT_DIR) encode TEXT_FILE (a held-out text, one document) to the ids `cephalo data` wrote
     to SHARD: [BOS if --bos] + ids + [EOS].
  2. AutoModelForCausalLM.from_pretrained(EXPORT_DIR) loads the directory as it is and greedy
     generate() from the prompt `cephalo-worker sample --json --dump-logits SAMPLE_DUMP` used (its
     tokens: SAMPLE_DUMP's sample0.tokens, the first prompt_tokens of them the prompt) gives the
     same new tokens, and stops where sample stopped (EOS from generation_config.json, or the
     length).
prints "ok - ..." / "not ok - ..." / "ok - ... # SKIP why" lines
"""
import json
import struct
import sys

fails = 0


def report(ok, what):
    global fails
    print(("ok - " if ok else "not ok - ") + what)
    fails += not ok


def shard_tokens(path):
    raw = open(path, "rb").read()
    h = struct.unpack("<256i", raw[:1024])
    width = 2 if h[1] == 1 else 4
    return list(struct.unpack("<%d%s" % (h[2], "H" if width == 2 else "I"), raw[1024:1024 + width * h[2]]))


def main():
    if len(sys.argv) < 6:
        print(__doc__)
        return 2
    d, sample_json, sample_dump, text_file, shard = sys.argv[1:6]
    bos_first = "--bos" in sys.argv[6:]
    try:
        import tokenizers
        import torch
        import transformers
    except ImportError as e:
        print("ok - transformers round trip # SKIP %s" % e)
        return 0
    text = open(text_file, encoding="utf-8").read()
    want = shard_tokens(shard)

    tk = tokenizers.Tokenizer.from_file(d + "/tokenizer.json")
    ids = tk.encode(text, add_special_tokens=False).ids
    auto = transformers.AutoTokenizer.from_pretrained(d)
    aids = auto(text, add_special_tokens=False)["input_ids"]
    eos, bos = auto.eos_token_id, auto.bos_token_id
    body = want[1:-1] if bos_first else want[:-1]
    report(ids == body, "tokenizers encodes the held-out text (%d tokens) to cephalo data's ids" % len(body))
    report(aids == body, "AutoTokenizer (%s) encodes it the same" % type(auto).__name__)
    report(want[-1] == eos and (not bos_first or want[0] == bos),
           "the shard's document ends with the tokenizer's EOS %r%s" % (eos, " and starts with BOS" if bos_first else ""))

    model = transformers.AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
    model.eval()
    s = json.loads(open(sample_json).read().splitlines()[0])
    sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/ref")
    import st  # the project's safetensors reader (numpy)
    t, _ = st.read(sample_dump)
    toks = [int(x) for x in t["sample0.tokens"]]
    prompt, new = toks[:s["prompt_tokens"]], list(s["tokens"])
    report(toks[s["prompt_tokens"]:s["prompt_tokens"] + len(new)] == new, "the dump's tokens are the JSON's")
    if s["stop"] == "eos" and (not new or new[-1] != eos):
        new.append(eos)  # generate() returns the EOS it stops at
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=len(new), do_sample=False, num_beams=1,
                             pad_token_id=eos)
    got = out[0, len(prompt):].tolist()
    report(got == new, "AutoModelForCausalLM greedy: %d new tokens equal cephalo-worker sample's (%s)" %
           (len(new), "stopped at EOS" if s["stop"] == "eos" else "length"))
    if got != new:
        print("#   cephalo: %s\n#   hf:      %s" % (new[:24], got[:24]))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
