#!/usr/bin/python3
"""The PyTorch peers of `make bench-gpu` (bench/bench_gpu.sh): GPT-2 and Llama training steps on the
GPU in eager mode, under torch.compile, and as single-rank FSDP2 (fully_shard, world 1), in fp32
(TF32 matmuls, as cephalo's fp32 on the GPU), bf16 (autocast; FSDP2: MixedPrecisionPolicy with
bf16 parameters and fp32 gradient reduction) or fp16 (autocast to float16 with a GradScaler at its
defaults, as cephalo's --precision fp16; not under FSDP2, which needs a sharded scaler). Same work as one cephalo-worker step: forward and
backward over B/m microbatches, global-norm clipping, AdamW. Prints one JSON line:

  {"mode": "compile", "precision": "bf16", "tokens_per_s": ..., "step_ms": ..., "peak_bytes": ...,
   "params": ..., "torch": "2.5.1", ...}   or   {"mode": ..., "unavailable": "why"}

    torch_gpu.py --model gpt2-124m --seq 1024 --batch 16 --micro 8 --precision bf16 --mode eager
    torch_gpu.py --selftest        # tiny models on the CPU, 2 steps, every mode this torch has

Attention is F.scaled_dot_product_attention (flash / memory-efficient kernels); without it (torch
< 2.0) a masked-softmax matmul. Synthetic random tokens; timed over --steps after --warmup.
"""
import argparse
import contextlib
import json
import math
import os
import socket
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# the built-in models of `cephalo models` (planner/model.c)
MODELS = {
    "gpt2-124m": dict(arch="gpt", layers=12, d=768, heads=12, kv=12, ff=3072, vocab=50257, max_seq=1024),
    "gpt2-350m": dict(arch="gpt", layers=24, d=1024, heads=16, kv=16, ff=4096, vocab=50257, max_seq=1024),
    "gpt2-774m": dict(arch="gpt", layers=36, d=1280, heads=20, kv=20, ff=5120, vocab=50257, max_seq=1024),
    "tinyllama-1.1b": dict(arch="llama", layers=22, d=2048, heads=32, kv=4, ff=5632, vocab=32000, max_seq=2048),
    "tiny-gpt": dict(arch="gpt", layers=2, d=64, heads=4, kv=4, ff=256, vocab=256, max_seq=128),
    "tiny-llama": dict(arch="llama", layers=2, d=64, heads=4, kv=2, ff=176, vocab=256, max_seq=64),
}
HAVE_SDPA = hasattr(F, "scaled_dot_product_attention")


def attention(q, k, v):
    """q [B,H,T,hd], k/v [B,Hkv,T,hd]; causal."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    if HAVE_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


def rope_tables(T, hd, device, theta=10000.0):
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=device, dtype=torch.float32) / hd)
    f = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv)
    emb = torch.cat((f, f), dim=-1)
    return emb.cos(), emb.sin()


def rotate(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos.to(x.dtype) + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin.to(x.dtype)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        d, hd = c["d"], c["d"] // c["heads"]
        bias = c["arch"] == "gpt"
        self.n1 = nn.LayerNorm(d) if bias else RMSNorm(d)
        self.n2 = nn.LayerNorm(d) if bias else RMSNorm(d)
        self.qkv = nn.Linear(d, (c["heads"] + 2 * c["kv"]) * hd, bias=bias)
        self.proj = nn.Linear(d, d, bias=bias)
        if bias:
            self.fc = nn.Linear(d, c["ff"])
        else:
            self.gate = nn.Linear(d, c["ff"], bias=False)
            self.up = nn.Linear(d, c["ff"], bias=False)
        self.down = nn.Linear(c["ff"], d, bias=bias)

    def forward(self, x, rope):
        B, T, d = x.shape
        H, Hkv, hd = self.c["heads"], self.c["kv"], d // self.c["heads"]
        q, k, v = self.qkv(self.n1(x)).split([H * hd, Hkv * hd, Hkv * hd], dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, Hkv, hd).transpose(1, 2)
        v = v.view(B, T, Hkv, hd).transpose(1, 2)
        if rope is not None:
            q, k = rotate(q, *rope), rotate(k, *rope)
        x = x + self.proj(attention(q, k, v).transpose(1, 2).reshape(B, T, d))
        h = self.n2(x)
        if self.c["arch"] == "gpt":
            return x + self.down(F.gelu(self.fc(h), approximate="tanh"))
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class LM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c["vocab"], c["d"])
        if c["arch"] == "gpt":
            self.wpe = nn.Embedding(c["max_seq"], c["d"])
            self.norm = nn.LayerNorm(c["d"])
        else:
            self.norm = RMSNorm(c["d"])
            self.head = nn.Linear(c["d"], c["vocab"], bias=False)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * c["layers"]) if name.endswith(("proj.weight", "down.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids, targets):
        T = ids.shape[1]
        x = self.wte(ids)
        rope = None
        if self.c["arch"] == "gpt":
            x = x + self.wpe.weight[:T]
        else:
            rope = rope_tables(T, self.c["d"] // self.c["heads"], ids.device)
        for b in self.blocks:
            x = b(x, rope)
        x = self.norm(x)
        logits = F.linear(x, self.wte.weight) if self.c["arch"] == "gpt" else self.head(x)
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def fsdp2_api():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # torch >= 2.6
        return fully_shard, MixedPrecisionPolicy
    except Exception:  # ImportError; old torch can fail inside the import (py3.11 dataclasses)
        pass
    try:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard  # 2.4, 2.5
        return fully_shard, MixedPrecisionPolicy
    except Exception:
        return None, None


def run(a, c, mode, dev):
    """One configuration; returns the JSON-able result."""
    base = {"mode": mode, "precision": a.precision, "model": a.model, "seq": a.seq, "batch": a.batch,
            "micro": a.micro, "torch": torch.__version__, "device": str(dev)}
    if mode == "compile" and not hasattr(torch, "compile"):
        return dict(base, unavailable="torch %s has no torch.compile" % torch.__version__)
    fully_shard, MPP = fsdp2_api() if mode == "fsdp2" else (None, None)
    if mode == "fsdp2" and fully_shard is None:
        return dict(base, unavailable="torch %s has no FSDP2 (fully_shard)" % torch.__version__)
    if a.batch % a.micro:
        return dict(base, error="--batch must be a multiple of --micro")
    bf16 = a.precision == "bf16"
    fp16 = a.precision == "fp16"
    if fp16 and mode == "fsdp2":
        return dict(base, unavailable="fp16 under FSDP2 needs a sharded GradScaler: not measured")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 = TF32 tensor cores, as cephalo's
        torch.backends.cudnn.allow_tf32 = True
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    torch.manual_seed(a.seed)
    pg = False
    try:
        model = LM(c).to(dev)
        params = sum(p.numel() for p in model.parameters())
        if mode == "fsdp2":
            import torch.distributed as dist
            if not dist.is_initialized():
                dist.init_process_group("nccl" if dev.type == "cuda" else "gloo",
                                        init_method="tcp://127.0.0.1:%d" % free_port(), rank=0, world_size=1)
                pg = True
            kw = {"mp_policy": MPP(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} if bf16 else {}
            for b in model.blocks:
                fully_shard(b, **kw)
            fully_shard(model, **kw)
        step_model = torch.compile(model) if mode == "compile" else model
        ps = list(model.parameters())
        decay = [p for p in ps if p.dim() == 2]
        no_decay = [p for p in ps if p.dim() != 2]
        kw = {"fused": True} if dev.type == "cuda" and mode != "fsdp2" else {}
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **kw)
        gen = torch.Generator(device=dev).manual_seed(a.seed)
        n_micro = a.batch // a.micro
        autocast = (torch.autocast(device_type=dev.type, dtype=torch.bfloat16) if bf16 and mode != "fsdp2"
                    else torch.autocast(device_type=dev.type, dtype=torch.float16) if fp16
                    else contextlib.nullcontext())
        scaler = None
        if fp16:  # GradScaler's defaults: scale 65536, x2 after 2000 clean steps, x0.5 on overflow
            gs = torch.amp.GradScaler if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler") else None
            scaler = gs("cuda", enabled=dev.type == "cuda") if gs else torch.cuda.amp.GradScaler(
                enabled=dev.type == "cuda")

        def step():
            opt.zero_grad(set_to_none=True)
            total = 0.0
            for _ in range(n_micro):
                tok = torch.randint(0, c["vocab"], (a.micro, a.seq + 1), generator=gen, device=dev)
                with autocast:
                    loss = step_model(tok[:, :-1], tok[:, 1:]) / n_micro
                (scaler.scale(loss) if scaler else loss).backward()
                total += loss.detach()
            if scaler:
                scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(ps, 1.0)
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
            return total

        def sync():
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)

        for _ in range(a.warmup):
            step()
        sync()
        times, loss = [], None
        for _ in range(a.steps):
            t0 = time.perf_counter()
            loss = step()
            sync()
            times.append(time.perf_counter() - t0)
        total = sum(times)
        out = dict(base, params=params, steps=a.steps, warmup=a.warmup,
                   tokens_per_s=round(a.batch * a.seq * a.steps / total, 1),
                   step_ms=round(1000 * total / a.steps, 3), step_ms_min=round(1000 * min(times), 3),
                   last_loss=round(float(loss), 4))
        if dev.type == "cuda":
            out["peak_bytes"] = torch.cuda.max_memory_allocated(dev)
        return out
    except torch.cuda.OutOfMemoryError if hasattr(torch.cuda, "OutOfMemoryError") else MemoryError as e:
        return dict(base, error="out of memory: %s" % str(e).splitlines()[0])
    except Exception as e:  # report and let the other rows run
        return dict(base, error="%s: %s" % (type(e).__name__, str(e).splitlines()[0] if str(e) else ""))
    finally:
        if pg:
            import torch.distributed as dist
            dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt2-124m", choices=sorted(MODELS))
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--micro", type=int, default=None, help="samples per microbatch (default: batch)")
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="bf16")
    ap.add_argument("--mode", choices=("eager", "compile", "fsdp2"), default="eager")
    ap.add_argument("--steps", type=int, default=17, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (compilation happens here)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default=None)
    ap.add_argument("--selftest", action="store_true", help="tiny models on the CPU, 2 steps, every mode")
    a = ap.parse_args()
    if a.selftest:
        dev = torch.device(a.device or "cpu")
        failed = 0
        for model in ("tiny-gpt", "tiny-llama"):
            for prec in ("fp32", "bf16"):
                for mode in ("eager", "compile", "fsdp2"):
                    a.model, a.precision, a.mode, a.seq, a.batch, a.micro = model, prec, mode, 32, 4, 2
                    a.steps, a.warmup = 2, 0
                    r = run(a, MODELS[model], mode, dev)
                    print(json.dumps(r))
                    failed += "error" in r or (mode == "eager" and "tokens_per_s" not in r)
        print("selftest: %s" % ("ok" if not failed else "%d configurations failed" % failed))
        return 1 if failed else 0
    a.micro = a.micro or a.batch
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if a.seq > MODELS[a.model]["max_seq"] and MODELS[a.model]["arch"] == "gpt":
        sys.exit("--seq %d exceeds %s's position table (%d)" % (a.seq, a.model, MODELS[a.model]["max_seq"]))
    print(json.dumps(run(a, MODELS[a.model], a.mode, dev)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
