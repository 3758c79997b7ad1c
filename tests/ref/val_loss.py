"""The validation loss of a checkpoint, computed independently in float64 PyTorch (tests/ref/models.py)
for `cephalo-worker eval` and `train --val-data` (tests/cli/test_eval.sh).

The samples: every window of the llm.c token shards given, in file order (window k of a shard of n
tokens: tokens [k*seq, k*seq + seq + 1), k < (n - 1) / seq). The worker's validation set is the
first N samples of its fixed permutation (docs/worker.md, "Validation"); with N at least the
number of windows that is every window once, and the mean does not depend on the order.
A shard with a loss mask beside it (X.mask, docs/data.md "Fine-tuning data") counts only the
targets whose token has mask byte 1: the mean is over those.

usage: val_loss.py CKPT SEQ SHARD...     prints the mean cross-entropy per target (%.12g)
CKPT: a checkpoint file or a sharded step directory (CLM models: GPT, Llama).
"""
import json
import os
import sys

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fsdp"))
import needs  # noqa: E402
needs.modules("numpy", "torch")
import numpy as np  # noqa: E402
import torch  # noqa: E402

import models  # noqa: E402
import plan_tool  # noqa: E402
import st  # noqa: E402

SHARD_MAGIC = 20240520


MASK_MAGIC = 0x4B53414D


def windows(path, seq):
    """[(tokens[seq+1], targets[seq]), ...]: targets -1 where the loss mask (if any) is 0."""
    raw = open(path, "rb").read()
    head = np.frombuffer(raw[:1024], np.int32)
    if head[0] != SHARD_MAGIC or head[1] not in (1, 2):
        sys.exit("%s: not an llm.c token shard" % path)
    n = int(head[2])
    tokens = np.frombuffer(raw[1024:], np.uint16 if head[1] == 1 else np.uint32)[:n].astype(np.int64)
    keep = np.ones(n, bool)
    mpath = (path[:-4] if path.endswith(".bin") else path) + ".mask"
    if os.path.exists(mpath):
        mraw = open(mpath, "rb").read()
        mh = np.frombuffer(mraw[:1024], np.int32)
        if mh[0] != MASK_MAGIC or mh[1] != 1 or mh[2] != n or len(mraw) != 1024 + n:
            sys.exit("%s: not the loss mask of %s" % (mpath, path))
        keep = np.frombuffer(mraw[1024:], np.uint8) == 1
    out = []
    for k in range((n - 1) // seq):
        w = tokens[k * seq: k * seq + seq + 1]
        out.append((w, np.where(keep[k * seq + 1: k * seq + seq + 1], w[1:], -1)))
    return out


def model_meta(ckpt):
    first = ckpt
    if os.path.isdir(ckpt):
        first = os.path.join(ckpt, json.load(open(os.path.join(ckpt, "index.json")))["files"][0]["file"])
    return json.loads(st.read(first)[1]["cephalo.model"])


def named_params(ckpt, meta):
    """{full tensor name: float64 tensor} from the checkpoint's flat per-unit parameters."""
    full = plan_tool.flatten(ckpt)
    d, H, Hkv = meta["d_model"], meta["n_head"], meta["n_kv_head"] or meta["n_head"]
    pre = models.Spec(arch=meta["arch"], n_layer=meta["n_layer"], d_model=d, n_head=H, n_kv_head=Hkv,
                      head_dim=d // H, d_ff=meta["d_ff"], vocab=meta["vocab"], max_seq=meta["max_seq"],
                      type_vocab=meta["type_vocab"], tied_head=bool(meta["tied_head"]) or meta["arch"] == "gpt")
    names = plan_tool.unit_names(meta)
    out, offset = {}, {u: 0 for u in names}
    for name, shape in models.layout(pre):
        unit = next(u for u in sorted(names, key=len, reverse=True) if name.startswith(u + "."))
        n = int(np.prod(shape))
        flat = full["param." + unit][offset[unit]: offset[unit] + n]
        out[name] = torch.from_numpy(flat.astype(np.float64).reshape(shape))
        offset[unit] += n
    for u in names:
        if offset[u] != len(full["param." + u]):
            sys.exit("unit %s: the layout covers %d of its %d parameters" % (u, offset[u], len(full["param." + u])))
    return out


def main(argv):
    if len(argv) < 4:
        sys.exit(__doc__)
    ckpt, seq, shards = argv[1], int(argv[2]), argv[3:]
    meta = model_meta(ckpt)
    if meta["arch"] not in ("gpt", "llama"):
        sys.exit("val_loss.py: CLM checkpoints only (GPT, Llama), not %s" % meta["arch"])
    P = named_params(ckpt, meta)
    spec, _ = models.Spec.from_meta(meta, P)
    wins = [w for path in shards for w in windows(path, seq)]
    total, count = 0.0, 0
    for i in range(0, len(wins), 16):
        chunk = torch.from_numpy(np.stack([w for w, _ in wins[i: i + 16]]))
        tg = torch.from_numpy(np.stack([t for _, t in wins[i: i + 16]]))
        n = int((tg >= 0).sum())
        if n == 0:
            continue
        logits, loss = models.forward(spec, P, {"inputs": chunk[:, :-1], "targets": tg, "loss_mean": "targets"})
        total += float(loss) * n  # the mean over the chunk's targets
        count += n
    print("%.12g" % (total / count))


if __name__ == "__main__":
    main(sys.argv)
