"""The oracle of `cephalo-worker sample` (docs/sample.md): a --dump-logits file against a full-sequence
float64 forward of the same tokens on a Hugging Face directory (hf_models.load + the
transformers-style forwards of check_export.py; for a checkpoint, its `cephalo-worker export`).

usage: sample_ref.py HF_DIR DUMP [--tol X]     prints "ok - ..." / "not ok - ..." lines, exit 1 on any
                                                failure

Checks, per sample of the dump:
  logits   every step's KV-cached logits (row s chose token prompt + s) = the full forward's logits
           at that position: ||ours - ref|| / ||ref|| <= tol (default 1e-5; fp32 vs float64)
  greedy   (temperature 0) every chosen token is the oracle's argmax: token for token the oracle's
           own greedy decode, since each step's prefix is the same; the smallest top-2 gap is shown
  support  (temperature > 0) every chosen token lies in the top-k set and in the top-p nucleus of
           its step's logits (computed here in float64 from the dumped logits)
"""
import argparse
import json
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import needs  # noqa: E402
needs.modules("numpy", "torch")
import numpy as np  # noqa: E402
import torch  # noqa: E402

import check_export  # noqa: E402
import hf_models  # noqa: E402
import st  # noqa: E402


def nucleus(logits, temperature, top_k, top_p):
    """The ids the sampler may choose at one step: top-k, then the smallest top-p prefix."""
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))
    keep = order[:top_k] if 0 < top_k < len(order) else order
    z = np.array([logits[i] for i in keep], dtype=np.float64)
    p = np.exp((z - z.max()) / temperature)
    if top_p < 1.0:
        total, mass, n = p.sum(), 0.0, 0
        while n < len(keep) and (n == 0 or mass < top_p * total):
            mass += p[n]
            n += 1
        # a token at the edge of the nucleus may fall either side by rounding: allow one more
        keep = keep[:n + 1] if n < len(keep) and abs(mass - top_p * total) < 1e-6 * total else keep[:n]
    return set(keep)


def main():
    ap = argparse.ArgumentParser(usage=__doc__)
    ap.add_argument("hf_dir")
    ap.add_argument("dump")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    cfg, W = hf_models.load(a.hf_dir)
    fwd = check_export.gpt2 if cfg["model_type"] == "gpt2" else check_export.llama
    T, meta = st.read(a.dump)
    m = json.loads(meta["cephalo.sample"])
    P, temp = int(m["prompt_tokens"]), float(m["temperature"])
    fails = 0

    def report(ok, msg):
        nonlocal fails
        print("%s - %s" % ("ok" if ok else "not ok", msg))
        fails += 0 if ok else 1

    name = os.path.basename(a.hf_dir.rstrip("/"))
    for k in range(int(m["samples"])):
        toks = np.asarray(T["sample%d.tokens" % k], dtype=np.int64)
        ours = np.asarray(T["sample%d.logits" % k], dtype=np.float64)
        steps = ours.shape[0]
        if steps == 0 or len(toks) != P + steps:
            report(False, "%s sample %d: %d tokens for %d prompt tokens and %d steps" % (name, k, len(toks), P, steps))
            continue
        ids = torch.from_numpy(toks[:P + steps - 1]).view(1, -1)
        ref = fwd(cfg, W, ids)[0, P - 1:].numpy()  # [steps, V]: the logits that chose tokens P..
        err = np.linalg.norm(ours - ref) / np.linalg.norm(ref)
        row = max(np.linalg.norm(ours[s] - ref[s]) / np.linalg.norm(ref[s]) for s in range(steps))
        report(err <= a.tol and row <= 10 * a.tol,
               "%s sample %d: KV-cached logits of %d steps = full float64 forward (rel err %.2e, worst step %.2e, tol %g)"
               % (name, k, steps, err, row, a.tol))
        chosen = toks[P:]
        if temp == 0:
            want = ref.argmax(axis=1)
            srt = np.sort(ref, axis=1)
            gap = float((srt[:, -1] - srt[:, -2]).min())
            same = int((want == chosen).sum())
            report(same == steps, "%s sample %d: greedy tokens = the oracle's greedy decode (%d/%d equal, smallest top-2 gap %.2e)"
                   % (name, k, same, steps, gap))
        else:
            V = int(m["vocab_sampled"])
            inside = sum(int(chosen[s]) in nucleus(list(ours[s][:V]), temp, int(m["top_k"]), float(m["top_p"]))
                         for s in range(steps))
            report(inside == steps, "%s sample %d: every sampled token lies in its step's top-k %d / top-p %g set (%d/%d)"
                   % (name, k, int(m["top_k"]), float(m["top_p"]), inside, steps))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
