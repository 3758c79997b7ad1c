#!/usr/bin/python3
"""An independent reader of `cephalo data --sft` output (docs/data.md "Fine-tuning data").

usage: sft_check.py examples DIR TOKENIZER.json JSONL... [--template FILE] [--bos]
       sft_check.py batches DIR DUMPDIR SEQ

examples: reads every DIR/*.bin shard and its .mask (format from the doc, not from the C code),
decodes the tokens with TOKENIZER.json's byte-level vocabulary and checks that the shards hold
the JSONL examples in order, each as runs of (text, mask bit): prompt 0 / response + EOS 1, or
per message the template's prefix 0, content and suffix 1 for the assistant (0 otherwise), then
EOS (1 after an assistant message); and that no example's first token (the one after an EOS) has
loss, which would predict it from the previous example.
batches: every row of DUMPDIR/batches.safetensors is a window of a shard, its targets the next
tokens where the mask is 1 and -1 where it is 0.
Prints "ok - ..." / "not ok - ..." lines; exit status 0 iff all are ok.
"""
import glob
import json
import os
import struct
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

MASK_MAGIC = 0x4B53414D
failed = False


def report(good, what):
    global failed
    failed |= not good
    print(("ok - " if good else "not ok - ") + what)


def read_shard(path):
    raw = open(path, "rb").read()
    h = struct.unpack("<256i", raw[:1024])
    assert h[0] == 20240520 and h[1] in (1, 2), path
    width = 2 if h[1] == 1 else 4
    toks = list(struct.unpack("<%d%s" % (h[2], "H" if width == 2 else "I"), raw[1024:1024 + width * h[2]]))
    mpath = path[:-4] + ".mask" if path.endswith(".bin") else path + ".mask"
    mraw = open(mpath, "rb").read()
    mh = struct.unpack("<256i", mraw[:1024])
    if mh[0] != MASK_MAGIC or mh[1] != 1 or mh[2] != len(toks) or len(mraw) != 1024 + len(toks) or any(mh[3:]):
        raise ValueError("%s: bad mask header %s or size %d for %d tokens" % (mpath, mh[:4], len(mraw), len(toks)))
    mask = list(mraw[1024:])
    if any(b > 1 for b in mask):
        raise ValueError("%s: a mask byte other than 0 or 1" % mpath)
    return toks, mask


def byte_decoder():
    """GPT-2's byte <-> character table, inverted."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, k = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + k)
            k += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def runs(toks, mask, id_bytes):
    """[(bytes, bit), ...]: maximal runs of tokens with one mask bit."""
    out = []
    for t, m in zip(toks, mask):
        if out and out[-1][1] == m:
            out[-1][0].extend(id_bytes(t))
        else:
            out.append([bytearray(id_bytes(t)), m])
    return [(bytes(b), m) for b, m in out]


def expected(lines, template, bos, eos):
    segs = []
    for line in lines:
        ex = json.loads(line)
        if "messages" in ex:
            if template.get("bos"):
                segs.append((b"<BOS>", 0))
            last = None
            for msg in ex["messages"]:
                r = template["roles"][msg["role"]]
                bit = 1 if msg["role"] == "assistant" else 0
                segs += [(r.get("prefix", "").encode(), 0), (msg["content"].encode(), bit),
                         (r.get("suffix", "").encode(), bit)]
                last = msg["role"]
            if template.get("eos", True):
                segs.append((eos, 1 if last == "assistant" else 0))
        else:
            if bos:
                segs.append((b"<BOS>", 0))
            segs += [(ex["prompt"].encode(), 0), (ex["response"].encode(), 1), (eos, 1)]
    merged = []
    for b, m in segs:
        if not b:
            continue
        if merged and merged[-1][1] == m:
            merged[-1][0].extend(b)
        else:
            merged.append([bytearray(b), m])
    return [(bytes(b), m) for b, m in merged]


def shards(d):
    files = sorted(glob.glob(os.path.join(d, "train_*.bin"))) + sorted(glob.glob(os.path.join(d, "val_*.bin")))
    return files


def check_examples(argv):
    d, tokpath = argv[0], argv[1]
    rest, template, bos = [], {}, False
    i = 2
    while i < len(argv):
        if argv[i] == "--template":
            template = json.load(open(argv[i + 1]))
            i += 2
        elif argv[i] == "--bos":
            bos, i = True, i + 1
        else:
            rest.append(argv[i])
            i += 1
    tj = json.load(open(tokpath))
    dec = byte_decoder()
    inv = {v: k for k, v in tj["model"]["vocab"].items()}
    special = {a["id"]: a["content"] for a in tj["added_tokens"]}
    eos_name = next(s for s in ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>") if s in special.values())
    bos_id = next((i for i, s in special.items() if s in ("<|begin_of_text|>", "<s>")), None)

    def id_bytes(t):
        if t == bos_id:
            return b"<BOS>"
        if t in special:
            return special[t].encode()
        return bytes(dec[c] for c in inv[t])

    lines = [ln for f in rest for ln in open(f, encoding="utf-8").read().split("\n") if ln.strip()]
    files = shards(d)
    toks, mask = [], []
    for f in files:
        t, m = read_shard(f)
        toks += t
        mask += m
    report(len(files) > 0, "%d shards, each with a loss mask of its length (%d tokens)" % (len(files), len(toks)))
    got = runs(toks, mask, id_bytes)
    want = expected(lines, template, bos, eos_name.encode())
    if got == want:
        report(True, "%d examples: %d runs of (text, mask bit) as the JSONL and template say" % (len(lines), len(want)))
    else:
        k = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        report(False, "run %d differs: shards %r, expected %r (%d runs vs %d)" % (
            k, got[k] if k < len(got) else None, want[k] if k < len(want) else None, len(got), len(want)))
    report(0 < sum(mask) < len(mask), "the mask has both bits (%d of %d tokens with loss)" % (sum(mask), len(mask)))
    # no loss crosses an example boundary: the token after each EOS (an example's first) is no target
    eos_id = next(i for i, s in special.items() if s == eos_name)
    starts = [0] + [i + 1 for i in range(len(toks) - 1) if toks[i] == eos_id]
    report(all(mask[i] == 0 for i in starts), "no example's first token has loss (%d starts)" % len(starts))


def check_batches(argv):
    import numpy as np
    import st
    d, dump, seq = argv[0], argv[1], int(argv[2])
    windows = {}
    for f in sorted(glob.glob(os.path.join(d, "train_*.bin"))):
        t, m = read_shard(f)
        for w in range((len(t) - 1) // seq):
            a = w * seq
            windows.setdefault(tuple(t[a:a + seq]), []).append(
                tuple(t[a + k + 1] if m[a + k + 1] else -1 for k in range(seq)))
    B, _ = st.read(os.path.join(dump, "batches.safetensors"))
    rows = bad = masked = kept = 0
    k = 0
    while "step%d.inputs" % k in B:
        for x, y in zip(np.asarray(B["step%d.inputs" % k]), np.asarray(B["step%d.targets" % k])):
            rows += 1
            y = tuple(int(v) for v in y)
            if y not in windows.get(tuple(int(v) for v in x), []):
                bad += 1
            masked += sum(1 for v in y if v < 0)
            kept += sum(1 for v in y if v >= 0)
        k += 1
    report(rows > 0 and bad == 0, "%d dumped rows of %d steps are windows of the shards with their masked targets "
           "(%d not)" % (rows, k, bad))
    report(masked > 0 and kept > 0, "the dumped targets have both masked (%d) and counted (%d) positions" % (masked, kept))


if __name__ == "__main__":
    try:
        {"examples": check_examples, "batches": check_batches}[sys.argv[1]](sys.argv[2:])
    except (OSError, ValueError, KeyError, IndexError, AssertionError) as e:
        report(False, "sft_check.py could not check: %s: %s" % (type(e).__name__, e))
    sys.exit(1 if failed else 0)
