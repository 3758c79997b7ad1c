#!/usr/bin/python3
"""The PyTorch peer of the worker's CPU benchmark (`make bench`): a GPT-2 style model trained on
random tokens in fp32 with AdamW and global-norm clipping, the same work as one cephalo-worker
training step (forward, backward, clip, AdamW). Prints one JSON line:

  {"tokens_per_s": ..., "step_ms": ..., "peak_rss_bytes": ..., "threads": T, "torch": "1.13.0", ...}

Timed over --steps steps after --warmup-steps untimed ones. Attention is written with matmuls and
a masked softmax (torch 1.13 has no F.scaled_dot_product_attention); --attn mha uses
nn.MultiheadAttention instead (in training mode it runs the same batched-matmul path: measured
equal, 5.06 vs 5.08 s/step at the defaults on 2 threads). AdamW runs multi-tensor (foreach=True).
"""
import argparse
import json
import math
import os
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads, attn):
        super().__init__()
        self.h = heads
        self.ln_1 = nn.LayerNorm(d)
        self.ln_2 = nn.LayerNorm(d)
        self.attn_kind = attn
        if attn == "mha":
            self.mha = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)
        else:
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
        self.fc = nn.Linear(d, 4 * d)
        self.fc_proj = nn.Linear(4 * d, d)

    def attention(self, x, mask):
        B, T, d = x.shape
        if self.attn_kind == "mha":
            return self.mha(x, x, x, attn_mask=mask, need_weights=False)[0]
        q, k, v = self.qkv(x).split(d, dim=2)
        hd = d // self.h
        q = q.view(B, T, self.h, hd).transpose(1, 2)
        k = k.view(B, T, self.h, hd).transpose(1, 2)
        v = v.view(B, T, self.h, hd).transpose(1, 2)
        s = torch.baddbmm(mask.expand(B * self.h, T, T), q.reshape(B * self.h, T, hd),
                          k.reshape(B * self.h, T, hd).transpose(1, 2), alpha=1.0 / math.sqrt(hd))
        y = torch.bmm(torch.softmax(s, dim=-1), v.reshape(B * self.h, T, hd))
        return self.proj(y.view(B, self.h, T, hd).transpose(1, 2).reshape(B, T, d))

    def forward(self, x, mask):
        x = x + self.attention(self.ln_1(x), mask)
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, seq, layers, d, heads, attn):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads, attn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "out_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
        # additive causal mask: 0 on and below the diagonal, -inf above
        self.register_buffer("mask", torch.full((seq, seq), float("-inf")).triu(1), persistent=False)

    def forward(self, ids, targets):
        T = ids.shape[1]
        x = self.wte(ids) + self.wpe.weight[:T]
        mask = self.mask[:T, :T]
        for b in self.blocks:
            x = b(x, mask)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup-steps", type=int, default=2, help="untimed steps first")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--attn", choices=("matmul", "mha"), default="matmul")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.d % a.heads:
        ap.error("--d must be a multiple of --heads")

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = GPT(a.vocab, a.seq, a.layers, a.d, a.heads, a.attn).train()
    params = list(model.parameters())
    decay = [p for p in params if p.dim() == 2]
    no_decay = [p for p in params if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    gen = torch.Generator().manual_seed(a.seed)

    def step():
        tok = torch.randint(0, a.vocab, (a.batch, a.seq + 1), generator=gen)
        opt.zero_grad(set_to_none=True)
        loss = model(tok[:, :-1], tok[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return float(loss)

    for _ in range(a.warmup_steps):
        step()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    total = sum(times)
    print(json.dumps({
        "tokens_per_s": round(a.batch * a.seq * a.steps / total, 1) if total > 0 else None,
        "step_ms": round(1000 * total / max(1, a.steps), 3),
        "step_ms_min": round(1000 * min(times), 3) if times else None,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "threads": a.threads,
        "torch": torch.__version__,
        "params": sum(p.numel() for p in params),
        "layers": a.layers, "d": a.d, "heads": a.heads, "seq": a.seq, "batch": a.batch, "vocab": a.vocab,
        "steps": a.steps, "warmup_steps": a.warmup_steps, "attn": a.attn, "last_loss": round(loss, 4) if times else None,
    }))


if __name__ == "__main__":
    main()
