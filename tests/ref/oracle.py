#!/usr/bin/python3
"""The PyTorch oracle for the C trainer: checks a `cephalo-worker train --dump DIR` run.

usage: oracle.py DUMPDIR LOGFILE [--quiet] [--precision fp32|tf32|bf16]

Reads DUMPDIR/{init,batches,step0,final}.safetensors and the JSON-lines log, recomputes everything
in float64 with the independent models of models.py and torch.optim.AdamW, and prints one line
per check, "ok - WHAT (measured)" or "not ok - WHAT (details)", then "# " lines with the maxima.
Exit status 0 iff every check is ok. docs/worker-model.md ("The PyTorch oracle") explains the
checks and tolerances.

Settings missing from the `cephalo.train` metadata take the values in DEFAULTS (each use is
printed as "# assumed ..."); field spellings accepted are in TRAIN_ALIASES.
"""
import json
import math
import os
import re
import sys

import needs  # noqa: E402
needs.modules("numpy", "torch")
import numpy as np
import torch

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402
import st  # noqa: E402

# ---- tolerances (relative errors ||C - oracle|| / ||oracle||) ----
TOL_LOGITS = 1e-5
TOL_LOSS = 1e-5
TOL_GRAD = 1e-5
TOL_LR = 1e-6  # the schedule is a formula: only print precision matters
TOL_STEP_LOSS = 1e-5
TOL_GRAD_NORM = 1e-5
TOL_FINAL = 1e-4
# Looser tolerances for runs whose matmuls are not fp32 (cephalo-worker-cuda --device cuda:
# --precision fp32 uses TF32 tensor cores, --precision bf16 rounds matmul operands to bf16).
# A TF32 product carries ~2^-10 relative error (10 mantissa bits, tensor cores may truncate),
# a bf16 one ~2^-8 (7 bits, 8x coarser). Logits go through ~2 matmuls per block: a few 1e-3 (TF32);
# gradients through more, and small ones (biases, norms) are cancellations of large terms: 2e-2;
# Adam turns a gradient's sign noise into whole lr-sized steps, so the final parameters move
# apart by up to ~lr per step on elements whose gradients are within the noise: 3e-2 after 5
# steps. bf16: the same reasoning with 2^-8, about 5-8x. The default (fp32) is unchanged.
# ADAM_SENS_REL: see ADAM_SENS below.
PRECISION_TOLS = {
    "tf32": {"TOL_LOGITS": 5e-3, "TOL_LOSS": 1e-3, "TOL_GRAD": 2e-2, "TOL_STEP_LOSS": 2e-3,
             "TOL_GRAD_NORM": 1e-2, "TOL_FINAL": 3e-2, "ADAM_SENS_REL": 2.0 ** -10},
    "bf16": {"TOL_LOGITS": 3e-2, "TOL_LOSS": 1e-2, "TOL_GRAD": 1e-1, "TOL_STEP_LOSS": 2e-2,
             "TOL_GRAD_NORM": 5e-2, "TOL_FINAL": 1.5e-1, "ADAM_SENS_REL": 2.0 ** -8},
}
# Adam's update g/(sqrt(v)+eps) amplifies fp32 rounding of gradients near eps: elements with
# 0 < sqrt(v_hat) < ADAM_SENS at some step are only checked against the bound of an Adam step.
# Under reduced-precision matmuls a gradient element also carries noise of about one rounding
# unit of its tensor's largest gradient, so an element with sqrt(v_hat) below ADAM_SENS_REL x
# max|g| of its tensor at that step is just as ill-conditioned: its Adam step can take either
# sign (seen on an H200, TF32: two of tiny-gpt's fc.bias elements with a step-0 gradient of
# 2.9e-7 against a tensor maximum of 3.2e-3 moved a whole step apart, 4e-2 of that tensor).
ADAM_SENS = 1e-7
ADAM_SENS_REL = 0.0

# ---- the optimizer settings: metadata names and what is assumed when one is missing ----
TRAIN_ALIASES = {
    "lr": ("lr", "learning_rate", "max_lr"),
    "min_lr": ("min_lr", "lr_min", "final_lr"),
    "warmup": ("warmup", "warmup_steps"),
    "steps": ("steps", "total_steps", "max_steps"),
    "weight_decay": ("weight_decay", "wd"),
    "beta1": ("beta1", "b1"),
    "beta2": ("beta2", "b2"),
    "eps": ("eps", "adam_eps", "epsilon"),
    "clip": ("clip", "grad_clip", "max_grad_norm", "clip_norm"),
}
DEFAULTS = {"min_lr": None, "warmup": 0, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
            "eps": 1e-8, "clip": 1.0}
# "lr" has no default: without it the run cannot be reproduced. "steps" defaults to the number
# of steps in batches.safetensors, "min_lr" to lr/10 (the worker's default).


class Report:
    def __init__(self):
        self.failed = 0
        self.summary = []

    def check(self, good, what, detail):
        print("%s - %s (%s)" % ("ok" if good else "not ok", what, detail))
        if not good:
            self.failed += 1
        sys.stdout.flush()
        return good

    def note(self, text):
        print("# " + text)


def rel(a, b):
    """||a - b|| / ||b|| in float64 (0 when both are 0)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    num = np.linalg.norm((a - b).ravel())
    den = np.linalg.norm(b.ravel())
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return float(num / den)


class PFloat(float):
    """A float from the log that remembers its printed text, so that a comparison can allow for
    the precision it was printed with (half a unit in its last digit)."""

    def __new__(cls, text):
        f = float.__new__(cls, text)
        f.text = text
        return f

    def half_ulp(self):
        m = re.fullmatch(r"[+-]?(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?", self.text.strip())
        if not m:
            return 0.0
        frac = len(m.group(2) or "")
        exp = int(m.group(3) or 0)
        return 0.5 * 10.0 ** (exp - frac)


def close(measured, ref, tol):
    """Relative error of a printed number, and whether it is within tol or its print precision."""
    err = abs(float(measured) - ref) / abs(ref) if ref != 0 else abs(float(measured))
    slack = measured.half_ulp() / abs(ref) if isinstance(measured, PFloat) and ref != 0 else 0.0
    return err, err <= max(tol, 1.01 * slack)


def read_log(path):
    """The per-step records: {step: {"loss", "lr", "grad_norm"}}, numbers as PFloat."""
    recs = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                o = json.loads(line, parse_float=PFloat)
            except json.JSONDecodeError as e:
                raise ValueError("%s:%d: not JSON: %s" % (path, i, e)) from None
            if isinstance(o, dict) and "step" in o and "loss" in o:
                recs.append(o)
    return recs


def train_settings(meta, K, rep):
    try:
        t = json.loads(meta.get("cephalo.train", "{}"))
    except json.JSONDecodeError as e:
        raise ValueError("cephalo.train metadata is not JSON: %s" % e) from None
    out = {}
    for field, names in TRAIN_ALIASES.items():
        v = next((t[n] for n in names if n in t and t[n] is not None), None)
        if v is None and field == "beta1" and isinstance(t.get("betas"), list):
            v = t["betas"][0]
        if v is None and field == "beta2" and isinstance(t.get("betas"), list):
            v = t["betas"][1]
        if v is None:
            if field == "lr":
                raise ValueError("cephalo.train lacks lr")
            v = K if field == "steps" else DEFAULTS[field]
            if field == "min_lr":
                v = out["lr"] / 10  # the worker's default (cephalo-worker train --help)
            rep.note("assumed %s = %s (not in cephalo.train)" % (field, v))
        out[field] = float(v)
    out["warmup"], out["steps"] = int(out["warmup"]), int(out["steps"])
    # loss-masked (fine-tuning) data: the mean over the batch's targets, not over samples
    out["loss_mean"] = t.get("loss_mean", "samples")
    if out["loss_mean"] not in ("samples", "targets"):
        raise ValueError("cephalo.train loss_mean %r is not samples or targets" % out["loss_mean"])
    out["schedule"] = t.get("schedule", "cosine")  # checkpoints before --schedule: cosine
    if out["schedule"] not in ("cosine", "linear", "constant"):
        raise ValueError("cephalo.train schedule %r is not cosine, linear or constant" % out["schedule"])
    return out, t


def lr_at(tr, s):
    """The doc's schedule, step s 0-based."""
    lr, min_lr, warmup, steps = tr["lr"], tr["min_lr"], tr["warmup"], tr["steps"]
    if s < warmup:
        return lr * (s + 1) / warmup
    p = min(1.0, (s - warmup) / max(1, steps - warmup))
    schedule = tr.get("schedule", "cosine")
    if schedule == "constant":
        return lr
    if schedule == "linear":
        return min_lr + (lr - min_lr) * (1.0 - p)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * p))


def batch_of(spec, B, k, loss_mean="samples"):
    if spec.arch == "vit":
        return {"images": torch.from_numpy(B["step%d.images" % k]).double(),
                "labels": torch.from_numpy(B["step%d.labels" % k]).long()}
    return {"inputs": torch.from_numpy(B["step%d.inputs" % k]).long(),
            "targets": torch.from_numpy(B["step%d.targets" % k]).long(), "loss_mean": loss_mean}


def no_target(batch):
    """A loss-masked batch without a target that counts: it has no loss, and the step makes no
    update (no optimizer step, no weight decay; docs/worker.md "Output")."""
    return batch.get("loss_mean") == "targets" and int((batch["targets"] >= 0).sum()) == 0


def adam_ratio_bound(b1, b2, t):
    """max |m_hat / sqrt(v_hat)| after t steps for any gradients (Cauchy-Schwarz)."""
    r = b1 * b1 / b2
    geo = sum(r ** j for j in range(t))
    return (1 - b1) / (1 - b1 ** t) * math.sqrt((1 - b2 ** t) / (1 - b2)) * math.sqrt(geo)


def set_precision(argv):
    """Removes --quiet and --precision P from argv; applies PRECISION_TOLS[P] (P != fp32)."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--precision" and i + 1 < len(argv):
            p, i = argv[i + 1], i + 2
        elif a.startswith("--precision="):
            p, i = a.split("=", 1)[1], i + 1
        else:
            if a != "--quiet":
                out.append(a)
            i += 1
            continue
        if p not in ("fp32", "tf32", "bf16"):
            raise SystemExit("oracle.py: --precision must be fp32, tf32 or bf16 (got %r)" % p)
        globals().update(PRECISION_TOLS.get(p, {}))
        if p != "fp32":
            print("# precision %s: tolerances %s" % (p, ", ".join(
                "%s %.0e" % (k[4:].lower() if k.startswith("TOL_") else k.lower(), v)
                for k, v in PRECISION_TOLS[p].items())))
    return out


def main(argv):
    argv = set_precision(argv)
    if len(argv) < 3:
        print("usage: oracle.py DUMPDIR LOGFILE [--precision fp32|tf32|bf16]", file=sys.stderr)
        return 2
    dump, logfile = argv[1], argv[2]
    rep = Report()
    torch.set_default_dtype(torch.float64)

    init, meta = st.read(os.path.join(dump, "init.safetensors"))
    try:
        mmeta = json.loads(meta["cephalo.model"]) if "cephalo.model" in meta else {}
    except json.JSONDecodeError as e:
        raise ValueError("cephalo.model metadata is not JSON: %s" % e) from None
    if not mmeta:
        rep.note("init.safetensors has no cephalo.model metadata: shapes derived from tensors")
    spec, notes = models.Spec.from_meta(mmeta, init)
    for n in notes:
        rep.note(n)
    rep.note("model %s: %s" % (mmeta.get("name", "?"), spec))

    # layout: exactly the doc's tensors with the doc's shapes
    want = models.layout(spec)
    wnames = [n for n, _ in want]
    bad = [n for n, sh in want if n not in init or tuple(init[n].shape) != tuple(sh)]
    extra = sorted(set(init) - set(wnames))
    rep.check(not bad and not extra, "init.safetensors has the documented %d tensors" % len(want),
              "missing or misshapen: %s; unexpected: %s" % (bad[:5], extra[:5]) if bad or extra else "%d elements" % sum(
                  int(np.prod(sh)) for _, sh in want))
    if bad:
        return 1

    Bt, _ = st.read(os.path.join(dump, "batches.safetensors"))
    key = "images" if spec.arch == "vit" else "inputs"
    K = 0
    while "step%d.%s" % (K, key) in Bt:
        K += 1
    if K == 0:
        rep.check(False, "batches.safetensors holds step0.%s" % key, "found %s" % sorted(Bt)[:6])
        return 1
    tr, traw = train_settings(meta, K, rep)
    b0 = batch_of(spec, Bt, 0, tr["loss_mean"])
    nb = (b0["images"] if spec.arch == "vit" else b0["inputs"]).shape[0]
    rep.note("%d steps of %d samples in batches.safetensors" % (K, nb))
    rep.note("train settings: %s" % json.dumps(tr))
    if tr["steps"] != K:
        rep.note("schedule length %d != %d dumped steps" % (tr["steps"], K))

    S0, _ = st.read(os.path.join(dump, "step0.safetensors"))
    final, _ = st.read(os.path.join(dump, "final.safetensors"))
    recs = read_log(logfile)

    P = {n: torch.from_numpy(init[n].astype(np.float64)).requires_grad_(True) for n in wnames}

    # ---- 1. step 0 logits and loss ----
    logits, loss = models.forward(spec, P, b0)
    loss.backward()
    mx = {}
    if "logits" in S0 and tuple(S0["logits"].shape) == tuple(logits.shape):
        e = rel(S0["logits"], logits.detach().numpy())
        mx["logits"] = e
        rep.check(e <= TOL_LOGITS, "step 0 logits %s" % list(logits.shape), "rel err %.2e, tol %.0e" % (e, TOL_LOGITS))
    else:
        rep.check(False, "step 0 logits", "step0.safetensors logits %s, expected shape %s" % (
            None if "logits" not in S0 else S0["logits"].shape, list(logits.shape)))
    if "loss" in S0 and no_target(b0):
        c = float(S0["loss"].ravel()[0])
        rep.check(math.isnan(c), "step 0 has no target that counts: no loss (NaN in the dump)", "C %.7g" % c)
    elif "loss" in S0:
        ref = float(loss)
        e = abs(float(S0["loss"].ravel()[0]) - ref) / abs(ref)
        mx["loss"] = e
        rep.check(e <= TOL_LOSS, "step 0 loss %.6f" % ref, "C %.7g, rel err %.2e, tol %.0e" % (
            float(S0["loss"].ravel()[0]), e, TOL_LOSS))
    else:
        rep.check(False, "step 0 loss", "step0.safetensors has no loss")

    # ---- 2. step 0 gradients ----
    errs, missing = [], []
    for n in wnames:
        g = "grad." + n
        if g not in S0 or tuple(S0[g].shape) != tuple(P[n].shape):
            missing.append(n)
            continue
        errs.append((rel(S0[g], P[n].grad.numpy()), n))
    errs.sort(reverse=True)
    worst = errs[0] if errs else (math.inf, "-")
    mx["grad"] = worst[0]
    nbad = sum(1 for e, _ in errs if e > TOL_GRAD)
    ok = not missing and nbad == 0
    rep.check(ok, "step 0 gradients of %d tensors" % len(wnames),
              "worst %s rel err %.2e, tol %.0e" % (worst[1], worst[0], TOL_GRAD) if not missing
              else "missing or misshapen grad.%s" % ", grad.".join(missing[:5]))
    if nbad:
        for e, n in errs[:min(nbad, 10)]:
            rep.note("  grad.%s rel err %.2e" % (n, e))

    # ---- 3. K AdamW steps ----
    decay = [P[n] for n in wnames if P[n].dim() == 2]
    no_decay = [P[n] for n in wnames if P[n].dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tr["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=tr["lr"], betas=(tr["beta1"], tr["beta2"]), eps=tr["eps"])
    by_step = {}
    for r in recs:
        by_step.setdefault(int(r["step"]), r)
    shift = 0
    if by_step and 0 not in by_step and min(by_step) == 1:
        shift = 1
        rep.note("log steps are 1-based: log step s+1 is step s")
    losses, norms, lrs = [], [], []
    # elements whose Adam update is ill-conditioned: 0 < sqrt(v_hat) < ADAM_SENS at some step
    sens = {n: torch.zeros(P[n].shape, dtype=torch.bool) for n in wnames}
    for n, sl in models.zero_grad_slices(spec).items():
        sens[n][sl] = True
    for k in range(K):
        bk = batch_of(spec, Bt, k, tr["loss_mean"])
        if k > 0:
            opt.zero_grad(set_to_none=True)
            _, loss = models.forward(spec, P, bk)
            loss.backward()
        lr = lr_at(tr, k)
        for g in opt.param_groups:
            g["lr"] = lr
        if tr["clip"] > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(decay + no_decay, tr["clip"]))
        else:
            norm = float(torch.sqrt(sum((p.grad ** 2).sum() for p in decay + no_decay)))
        if no_target(bk):  # no loss, no update: AdamW's step count stays
            losses.append(None)
            norms.append(norm)
            lrs.append(lr)
            continue
        opt.step()
        for n in wnames:
            st_n = opt.state[P[n]]
            sv = (st_n["exp_avg_sq"] / (1 - tr["beta2"] ** float(st_n["step"]))).sqrt()
            floor = max(ADAM_SENS, ADAM_SENS_REL * float(P[n].grad.abs().max()))
            sens[n] |= (sv > 0) & (sv < floor)
        losses.append(float(loss))
        norms.append(norm)
        lrs.append(lr)

    missing = [k for k in range(K) if k + shift not in by_step]
    if missing:
        rep.check(False, "the log has steps 0..%d" % (K - 1), "missing steps %s in %s (%d records)" % (
            missing[:5], logfile, len(recs)))
    else:
        for field, ref, tol, name in (("lr", lrs, TOL_LR, "lr schedule"), ("loss", losses, TOL_STEP_LOSS, "losses"),
                                      ("grad_norm", norms, TOL_GRAD_NORM, "grad norms")):
            worst, all_ok, where = 0.0, True, 0
            for k in range(K):
                v = by_step[k + shift].get(field)
                if ref[k] is None:  # a step without a target: the log says so, with no loss
                    rec = by_step[k + shift]
                    if v is not None or rec.get("skipped") is not True or rec.get("targets") != 0:
                        all_ok, worst, where = False, math.inf, k
                        break
                    continue
                if v is None:
                    all_ok, worst, where = False, math.inf, k
                    break
                e, good = close(v, ref[k], tol)
                all_ok &= good
                if e >= worst:
                    worst, where = e, k
            mx["log " + field] = worst
            empties = sum(1 for x in ref if x is None)
            rep.check(all_ok, "%s of %d steps agree with the log%s" % (
                name, K, " (%d without a target: no loss, no update)" % empties if empties else ""),
                      "worst step %d: log %s, oracle %s, rel err %.2e, tol %.0e" % (
                          where, by_step[where + shift].get(field), ref[where], worst, tol))

    # final parameters: strictly where Adam is well conditioned, within its step bound elsewhere
    errs, missing = [], []
    # each side moves such an element by at most one Adam step per step, in either direction, so
    # the two can end up to two steps per step apart (seen on an H200, bf16: 3.78e-3 against one
    # side's 3.64e-3 on tiny-llama, an element whose steps took opposite signs more than once)
    bound = 2 * sum(lrs[k] * adam_ratio_bound(tr["beta1"], tr["beta2"], k + 1) for k in range(K)) * 1.01
    zmax, nsens = 0.0, 0
    for n in wnames:
        if n not in final or tuple(final[n].shape) != tuple(P[n].shape):
            missing.append(n)
            continue
        c, o = final[n].astype(np.float64), P[n].detach().numpy().copy()
        m = sens[n].numpy()
        if m.any():
            nsens += int(m.sum())
            zmax = max(zmax, float(np.max(np.abs(c[m] - o[m]))))
            c[m] = 0.0
            o[m] = 0.0
        errs.append((rel(c, o), n))
    errs.sort(reverse=True)
    worst = errs[0] if errs else (math.inf, "-")
    mx["final"] = worst[0]
    nbad = sum(1 for e, _ in errs if e > TOL_FINAL)
    rep.check(not missing and nbad == 0, "final parameters after %d steps" % K,
              "worst %s rel err %.2e, tol %.0e; %d ill-conditioned elements checked below" % (
                  worst[1], worst[0], TOL_FINAL, nsens) if not missing
              else "missing or misshapen in final.safetensors: %s" % missing[:5])
    for e, n in errs[:min(nbad, 10)]:
        rep.note("  %s rel err %.2e" % (n, e))
    mx["ill-conditioned abs"] = zmax
    rep.check(zmax <= bound, "%d ill-conditioned elements (%ssqrt(v_hat) < %.0e%s at some step) moved at "
              "most an Adam step per step each" % (nsens, "key part of the qkv biases, " if spec.arch != "llama" else "",
                                              ADAM_SENS, " or %.1e of max|g|" % ADAM_SENS_REL if ADAM_SENS_REL else ""),
              "max |C - oracle| %.2e, bound %.2e" % (zmax, bound))

    rep.note("maxima: " + ", ".join("%s %.2e" % kv for kv in mx.items()))
    rep.note("oracle: losses %s" % ", ".join("%.6f" % x for x in losses))
    return 1 if rep.failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv))
    except (OSError, ValueError, KeyError, st.FormatError) as e:
        print("not ok - oracle could not read the dump (%s: %s)" % (type(e).__name__, e))
        sys.exit(1)
