"""A BERT-like encoder in plain PyTorch, random weights: token + position + segment
embeddings with LayerNorm, post-LayerNorm blocks with bidirectional attention written out as
matmul -> softmax -> matmul (so softmax kernels show in a profile), a GELU MLP, and a
classification head on the first token with cross-entropy loss.

    python3 bert.py                           # inference forward with loss, bf16, on the GPU
    python3 bert.py --train --torch-trace t.json
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
    """Bidirectional multi-head self-attention with an explicit softmax."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x):  # x: [B, S, dim]
        b, s, dim = x.shape

        def heads(t):  # [B, S, dim] -> [B, H, S, D]
            return t.view(b, s, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # [B, H, S, S]
        probs = torch.softmax(scores, dim=-1)
        y = torch.matmul(probs, v)  # [B, H, S, D]
        return self.out(y.transpose(1, 2).reshape(b, s, dim))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc = nn.Linear(dim, hidden)
        self.proj = nn.Linear(hidden, dim)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x)))


class Layer(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.attn = Attention(dim, heads)
        self.attn_norm = nn.LayerNorm(dim, eps=1e-12)
        self.mlp = MLP(dim, hidden)
        self.mlp_norm = nn.LayerNorm(dim, eps=1e-12)

    def forward(self, x):
        x = self.attn_norm(x + self.attn(x))
        return self.mlp_norm(x + self.mlp(x))


class Bert(nn.Module):
    def __init__(self, vocab, max_seq, dim, layers, heads, hidden, classes):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(max_seq, dim)
        self.segments = nn.Embedding(2, dim)
        self.embed_norm = nn.LayerNorm(dim, eps=1e-12)
        self.layers = nn.ModuleList(Layer(dim, heads, hidden) for _ in range(layers))
        self.pooler = nn.Linear(dim, dim)
        self.classifier = nn.Linear(dim, classes)
        self.loss = nn.CrossEntropyLoss()
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)
            elif name.endswith("bias") and "norm" not in name:
                nn.init.zeros_(p)

    def forward(self, tokens, labels):  # tokens: [B, S] int64, labels: [B] int64
        s = tokens.shape[1]
        positions = torch.arange(s, device=tokens.device)
        segments = torch.zeros_like(tokens)
        x = self.tokens(tokens) + self.positions(positions) + self.segments(segments)
        x = self.embed_norm(x)
        for layer in self.layers:
            x = layer(x)
        pooled = torch.tanh(self.pooler(x[:, 0]))  # [B, dim]
        return self.loss(self.classifier(pooled), labels)


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=768, help="model width (default: 768)")
    p.add_argument("--layers", type=int, default=4, help="layers (default: 4)")
    p.add_argument("--heads", type=int, default=12, help="attention heads (default: 12)")
    p.add_argument("--hidden", type=int, default=None, help="MLP width (default: 4 x dim)")
    p.add_argument("--vocab", type=int, default=16384, help="vocabulary (default: 16384)")
    p.add_argument("--classes", type=int, default=4, help="classifier outputs (default: 4)")
    args = p.parse_args()
    args.batch = args.batch or 16
    args.seq = args.seq or 256
    args.hidden = args.hidden or 4 * args.dim
    common.check_sizes(args, batch=args.batch, seq=args.seq, dim=args.dim, layers=args.layers,
                       heads=args.heads, hidden=args.hidden, vocab=args.vocab,
                       classes=args.classes)
    if args.dim % args.heads:
        sys.exit(f"--dim {args.dim} is not a multiple of --heads {args.heads}")
    device, dtype = common.setup(args)

    model = Bert(args.vocab, args.seq, args.dim, args.layers, args.heads, args.hidden,
                 args.classes)
    model = model.to(device=device, dtype=dtype)
    tokens = common.random_tokens((args.batch, args.seq), args.vocab, device, args.seed + 1)
    labels = common.random_tokens((args.batch,), args.classes, device, args.seed + 2)
    summary = (f"bert: {common.count_parameters(model) / 1e6:.1f}M parameters, {args.layers} "
               f"layers, dim {args.dim}, {args.heads} heads, mlp {args.hidden}, vocab "
               f"{args.vocab}, {args.classes} classes; batch {args.batch} x seq {args.seq}")
    common.run(model, (tokens, labels), args, summary)


if __name__ == "__main__":
    main()
