"""A GPT-2-like decoder in plain PyTorch, random weights: token + position embeddings,
pre-LayerNorm blocks with causal attention (F.scaled_dot_product_attention) and a GELU MLP, a
final LayerNorm and an LM head tied to the token embedding, cross-entropy loss.

    python3 gpt2.py                           # inference forward with loss, bf16, on the GPU
    python3 gpt2.py --train --torch-trace t.json
"""

import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class Attention(nn.Module):
    """Causal multi-head self-attention with a fused qkv projection, as GPT-2 has."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def range_fields(self):  # the kernels' names may not say it (cuDNN's do not)
        return {"is_causal": 1}

    def forward(self, x):  # x: [B, S, dim]
        b, s, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=-1)
        # [B, S, dim] -> [B, H, S, D]
        q, k, v = (t.view(b, s, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, dim))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc = nn.Linear(dim, hidden)
        self.proj = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, vocab, max_seq, dim, layers, heads, hidden):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(max_seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.loss = nn.CrossEntropyLoss()
        # GPT-2's initialisation: N(0, 0.02), residual projections scaled by depth.
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, tokens, targets):  # tokens, targets: [B, S] int64
        s = tokens.shape[1]
        positions = torch.arange(s, device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head: [B, S, vocab]
        return self.loss(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=768, help="model width (default: 768)")
    p.add_argument("--layers", type=int, default=4, help="blocks (default: 4)")
    p.add_argument("--heads", type=int, default=12, help="attention heads (default: 12)")
    p.add_argument("--hidden", type=int, default=None, help="MLP width (default: 4 x dim)")
    p.add_argument("--vocab", type=int, default=16384, help="vocabulary (default: 16384)")
    args = p.parse_args()
    args.batch = args.batch or 8
    args.seq = args.seq or 512
    args.hidden = args.hidden or 4 * args.dim
    common.check_sizes(args, batch=args.batch, seq=args.seq, dim=args.dim, layers=args.layers,
                       heads=args.heads, hidden=args.hidden, vocab=args.vocab)
    if args.dim % args.heads:
        sys.exit(f"--dim {args.dim} is not a multiple of --heads {args.heads}")
    device, dtype = common.setup(args)

    model = GPT2(args.vocab, args.seq, args.dim, args.layers, args.heads, args.hidden)
    model = model.to(device=device, dtype=dtype)
    tokens = common.random_tokens((args.batch, args.seq), args.vocab, device, args.seed + 1)
    targets = common.random_tokens((args.batch, args.seq), args.vocab, device, args.seed + 2)
    summary = (f"gpt2: {common.count_parameters(model) / 1e6:.1f}M parameters, {args.layers} "
               f"layers, dim {args.dim}, {args.heads} heads, mlp {args.hidden}, vocab "
               f"{args.vocab}; batch {args.batch} x seq {args.seq}")
    common.run(model, (tokens, targets), args, summary)


if __name__ == "__main__":
    main()
