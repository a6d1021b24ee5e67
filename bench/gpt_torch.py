#!/usr/bin/python3
# PyTorch (fp32, CPU) training-speed baseline for meshtrain: the same GPT, AdamW and clipping.
# bench/train_vs_pytorch runs it next to meshtrain and compares tokens per second.
"""Time GPT training steps in PyTorch and print `tokens_per_s <x>`.

The model matches meshtrain: GPT-2 style pre-LayerNorm decoder, tied output
head, tanh GELU, AdamW with weight decay on 2-D tensors only, grad clipping 1.0.
Inputs are random byte tokens, a fresh batch each step.
"""
import argparse
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        B, T, C = x.shape
        head_size = C // self.heads
        q, k, v = self.qkv(x).split(C, dim=-1)
        q, k, v = (t.view(B, T, self.heads, head_size).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(head_size))
        future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(width, eps=1e-5)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width, eps=1e-5)
        self.mlp = MLP(width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, heads, width):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.h = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(width, eps=1e-5)
        self.init_weights(layers)

    def init_weights(self, layers):
        """GPT-2 init: N(0, 0.02) weights, zero biases, residual projections scaled down."""
        for name, param in self.named_parameters():
            if param.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(param, 0.0, std)
            elif name.endswith(".bias"):
                nn.init.zeros_(param)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe.weight[:T]
        for block in self.h:
            x = block(x)
        logits = self.lnf(x) @ self.wte.weight.T  # tied head
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def make_adamw(model, lr, weight_decay):
    decayed = [p for p in model.parameters() if p.dim() == 2]
    undecayed = [p for p in model.parameters() if p.dim() != 2]
    groups = [{"params": decayed, "weight_decay": weight_decay},
              {"params": undecayed, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95), eps=1e-8)


def random_batches(count, batch, seq, vocab, generator):
    """Random byte tokens (ids below min(256, vocab)); targets are the inputs shifted by one."""
    top = min(256, vocab)
    for _ in range(count):
        data = torch.randint(0, top, (batch, seq + 1), generator=generator)
        yield data[:, :-1], data[:, 1:]


def train_step(model, optimizer, tokens, targets, clip, autocast=False):
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(tokens, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    return loss.item()


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--context", type=int, default=256, help="context = sequence length trained on")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--autocast", action="store_true",
                        help="forward under torch.autocast('cpu', bfloat16) (fp32 master weights)")
    args = parser.parse_args()
    if args.width % args.heads != 0:
        parser.error("--width must be divisible by --heads")
    if args.steps < 1 or args.warmup < 0:
        parser.error("need --steps >= 1 and --warmup >= 0")
    return args


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.context, args.layers, args.heads, args.width)
    optimizer = make_adamw(model, args.lr, weight_decay=0.1)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"torch {torch.__version__} threads {torch.get_num_threads()} parameters {parameters}")

    generator = torch.Generator().manual_seed(args.seed)
    batches = random_batches(args.warmup + args.steps, args.batch, args.context, args.vocab, generator)
    step_seconds = []
    for step, (tokens, targets) in enumerate(batches):
        start = time.perf_counter()
        loss = train_step(model, optimizer, tokens, targets, clip=1.0, autocast=args.autocast)
        elapsed = time.perf_counter() - start
        timed = step >= args.warmup
        if timed:
            step_seconds.append(elapsed)
        print(f"step {step + 1} loss {loss:.4f} time {elapsed:.3f}s{'' if timed else ' (warm-up)'}", flush=True)

    tokens_per_step = args.batch * args.context
    median_seconds = statistics.median(step_seconds)
    print(f"step_s_median {median_seconds:.4f}")
    print(f"tokens_per_s_mean {tokens_per_step * len(step_seconds) / sum(step_seconds):.1f}")
    print(f"tokens_per_s {tokens_per_step / median_seconds:.1f}")


if __name__ == "__main__":
    main()
