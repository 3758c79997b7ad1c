#!/usr/bin/python3
"""PyTorch training curve for a `cephalo-worker[-cuda] train --dump DIR --log LOG` run.

usage: torch_train.py DUMPDIR LOGFILE [--precision fp32|tf32|bf16|fp16] [--tol X]
                      [--loss-scale-window N] [--device cuda|cpu] [--out FILE.json]

Trains the same model (tests/ref/models.py, the oracle's independent definitions) from the same
initial parameters (DUMPDIR/init.safetensors) on the same batches (DUMPDIR/batches.safetensors)
with torch.optim.AdamW, the same decay groups, global-norm clipping and lr schedule (read from
the dump's cephalo.train metadata with the oracle's own functions), then compares its per-step
losses with the worker's log:

    ok - N steps: losses agree within TOL (worst step k: cephalo X, torch Y, rel err E)

--precision: fp32 = strict fp32 matmuls in PyTorch (TF32 off) - the reference for cephalo's fp32
on the GPU, which uses TF32 tensor cores; tf32 = PyTorch with TF32 too; bf16 = torch.autocast
to bfloat16 (fp32 parameters, gradients and optimizer state, like cephalo's bf16); fp16 =
torch.autocast to float16 with torch.cuda.amp.GradScaler at its defaults (initial scale 65536,
growth x2 after --loss-scale-window = 2000 clean steps, backoff x0.5 and the step skipped on
any inf/NaN gradient), gradients unscaled before clipping - what cephalo's --precision fp16 does.
Default tolerances (relative, per step): 5e-3 for fp32/tf32, 3e-2 for bf16, 1e-2 for fp16
(docs/gpu.md says why). With fp16, when the worker's log records its loss scale ("loss_scale"),
the two scale sequences (and so the skipped steps) must be equal too. Exit status 0 iff the
curves agree.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

sys.dont_write_bytecode = True
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "ref"))
import models  # noqa: E402
import oracle  # noqa: E402
import st  # noqa: E402

DEFAULT_TOL = {"fp32": 5e-3, "tf32": 5e-3, "bf16": 3e-2, "fp16": 1e-2}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dump")
    ap.add_argument("log")
    ap.add_argument("--precision", choices=("fp32", "tf32", "bf16", "fp16"), default="fp32")
    ap.add_argument("--tol", type=float, default=None)
    ap.add_argument("--loss-scale-window", type=int, default=2000,
                    help="fp16: clean steps before the loss scale doubles (GradScaler's growth_interval)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None, help="write both curves as JSON here")
    a = ap.parse_args()
    tol = a.tol if a.tol is not None else DEFAULT_TOL[a.precision]
    dev = torch.device(a.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = a.precision == "tf32"
        torch.backends.cudnn.allow_tf32 = a.precision == "tf32"
        # models.py creates its masks and rope tables with factory calls: put them on the GPU
        if hasattr(torch, "set_default_device"):
            torch.set_default_device(dev)
        else:
            sys.exit("torch_train.py: torch >= 2.0 is needed on the GPU (torch.set_default_device)")
    torch.manual_seed(0)

    rep = oracle.Report()
    init, meta = st.read(os.path.join(a.dump, "init.safetensors"))
    mmeta = json.loads(meta.get("cephalo.model", "{}"))
    spec, _ = models.Spec.from_meta(mmeta, init)
    wnames = [n for n, _ in models.layout(spec)]
    Bt, _ = st.read(os.path.join(a.dump, "batches.safetensors"))
    key = "images" if spec.arch == "vit" else "inputs"
    K = 0
    while "step%d.%s" % (K, key) in Bt:
        K += 1
    tr, _ = oracle.train_settings(meta, K, rep)
    rep.note("model %s, %d steps, %s on %s (torch %s), settings %s" % (
        mmeta.get("name", spec.arch), K, a.precision, dev, torch.__version__, json.dumps(tr)))

    P = {n: torch.tensor(init[n].astype(np.float32), device=dev).requires_grad_(True) for n in wnames}
    decay = [P[n] for n in wnames if P[n].dim() == 2]
    no_decay = [P[n] for n in wnames if P[n].dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tr["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"])
    # fp16: GradScaler's defaults, spelled out (they are what cephalo's --precision fp16 copies)
    scaler = None
    if a.precision == "fp16":
        kw = dict(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5,
                  growth_interval=a.loss_scale_window, enabled=dev.type == "cuda")
        if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
            scaler = torch.amp.GradScaler("cuda", **kw)
        else:
            scaler = torch.cuda.amp.GradScaler(**kw)
    losses, scales = [], []
    for k in range(K):
        batch = {}
        for name, t in oracle.batch_of(spec, Bt, k).items():
            batch[name] = (t.float() if t.is_floating_point() else t).to(dev)
        opt.zero_grad(set_to_none=True)
        if a.precision in ("bf16", "fp16"):
            dtype = torch.bfloat16 if a.precision == "bf16" else torch.float16
            with torch.autocast(device_type=dev.type, dtype=dtype):
                _, loss = models.forward(spec, P, batch)
        else:
            _, loss = models.forward(spec, P, batch)
        lr = oracle.lr_at(tr, k)
        for g in opt.param_groups:
            g["lr"] = lr
        if scaler is not None:
            scales.append(float(scaler.get_scale()))  # the scale this step's backward used
            scaler.scale(loss).backward()
            scaler.unscale_(opt)  # clip the true gradients, as cephalo does
            if tr["clip"] > 0:
                torch.nn.utils.clip_grad_norm_(decay + no_decay, tr["clip"])
            scaler.step(opt)  # skipped when a gradient is inf/NaN
            scaler.update()
        else:
            loss.backward()
            if tr["clip"] > 0:
                torch.nn.utils.clip_grad_norm_(decay + no_decay, tr["clip"])
            opt.step()
        losses.append(float(loss))

    recs = oracle.read_log(a.log)
    by_step = {}
    for r in recs:
        by_step.setdefault(int(r["step"]), r)
    shift = 1 if by_step and 0 not in by_step and min(by_step) == 1 else 0
    ours = [float(by_step[k + shift]["loss"]) if k + shift in by_step else math.nan for k in range(K)]
    errs = [abs(c - t) / abs(t) if t else abs(c) for c, t in zip(ours, losses)]
    worst = max(range(K), key=lambda k: errs[k] if not math.isnan(errs[k]) else math.inf)
    good = all(e <= tol for e in errs)
    rep.check(good, "%d steps of %s: cephalo's losses agree with PyTorch's within %.0e" % (K, a.precision, tol),
              "worst step %d: cephalo %.6f, torch %.6f, rel err %.2e; final %.4f vs %.4f" % (
                  worst, ours[worst], losses[worst], errs[worst], ours[-1], losses[-1]))
    rep.note("cephalo: " + " ".join("%.4f" % x for x in ours))
    rep.note("torch:   " + " ".join("%.4f" % x for x in losses))
    if scales:
        rep.note("torch loss scales: " + " ".join("%g" % x for x in scales))
        theirs = [by_step[k + shift].get("loss_scale") if k + shift in by_step else None for k in range(K)]
        if all(x is not None for x in theirs):
            same = [float(x) for x in theirs] == scales
            good = good and same
            rep.check(same, "fp16: cephalo's loss scales (and so its skipped steps) equal GradScaler's",
                      "cephalo: " + " ".join("%g" % float(x) for x in theirs))
        else:
            rep.note("the worker's log has no loss_scale per step: the scales were not compared")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"precision": a.precision, "tol": tol, "cephalo": ours, "torch": losses, "rel_err": errs,
                       "torch_loss_scales": scales}, f)
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
