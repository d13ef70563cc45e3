"""A LLaMA-like decoder in plain PyTorch, random weights: RMSNorm, rotary embeddings (the
rotate-half convention of HF LLaMA), causal attention (F.scaled_dot_product_attention) with
optional grouped-query heads, a SwiGLU MLP, an untied LM head, cross-entropy loss.

    python3 llama.py                          # inference forward with loss, bf16, on the GPU
    python3 llama.py --train --kv-heads 4 --torch-trace t.json
"""

import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dim, computed in float32 as HF does."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryEmbeddingHalf(nn.Module):
    """Rotary position embedding, rotate-half convention: element i of the first half of the
    head dim pairs with element i of the second half, both rotated by angle pos * theta^(-2i/D).
    Applied to one tensor per call ([B, H, S, D]); the attention calls it for q and for k."""

    def __init__(self, head_dim, max_seq, theta=10000.0):
        super().__init__()
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(max_seq, dtype=torch.float32), inv_freq)  # [S, D/2]
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x):  # x: [B, H, S, D]
        s = x.shape[2]
        # HF LLaMA: full-width tables (each half repeated) and rotate_half(x) = [-x2, x1].
        cos = torch.cat((self.cos[:s], self.cos[:s]), dim=-1).to(x.dtype)  # [S, D]
        sin = torch.cat((self.sin[:s], self.sin[:s]), dim=-1).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def range_operand_shapes(self, x):
        s, half = x.shape[2], self.cos.shape[1]
        return [list(x.shape), [s, half], [s, half]]


class Attention(nn.Module):
    def __init__(self, dim, heads, kv_heads, max_seq):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.wq = nn.Linear(dim, heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(heads * self.head_dim, dim, bias=False)
        self.rotary = RotaryEmbeddingHalf(self.head_dim, max_seq)

    def range_fields(self):  # the kernels' names may not say it (cuDNN's do not)
        return {"is_causal": 1}

    def forward(self, x):  # x: [B, S, dim]
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)  # [B, H, S, D]
        k = self.wk(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self.rotary(q), self.rotary(k)
        if self.kv_heads != self.heads:  # grouped-query attention: share each k/v head
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class SwiGLU(nn.Module):
    """(silu(x W_gate^T) * (x W_up^T)) W_down^T."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.w_gate = nn.Linear(dim, hidden, bias=False)  # weight [hidden, dim]
        self.w_up = nn.Linear(dim, hidden, bias=False)  # weight [hidden, dim]
        self.w_down = nn.Linear(hidden, dim, bias=False)  # weight [dim, hidden]

    def forward(self, x):
        return self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class Block(nn.Module):
    def __init__(self, dim, heads, kv_heads, hidden, max_seq):
        super().__init__()
        self.attn_norm = RMSNorm(dim)
        self.attn = Attention(dim, heads, kv_heads, max_seq)
        self.mlp_norm = RMSNorm(dim)
        self.mlp = SwiGLU(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class Llama(nn.Module):
    def __init__(self, vocab, max_seq, dim, layers, heads, kv_heads, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(
            Block(dim, heads, kv_heads, hidden, max_seq) for _ in range(layers))
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.loss = nn.CrossEntropyLoss()
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, targets):  # tokens, targets: [B, S] int64
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.norm(x))  # [B, S, vocab]
        return self.loss(logits.view(-1, logits.shape[-1]), targets.view(-1))


def main():
    p = common.parser(__doc__.splitlines()[0])
    p.add_argument("--dim", type=int, default=1024, help="model width (default: 1024)")
    p.add_argument("--layers", type=int, default=4, help="blocks (default: 4)")
    p.add_argument("--heads", type=int, default=16, help="query heads (default: 16)")
    p.add_argument("--kv-heads", type=int, default=None,
                   help="key/value heads; fewer than --heads for grouped-query attention "
                        "(default: --heads)")
    p.add_argument("--hidden", type=int, default=2816, help="SwiGLU width (default: 2816)")
    p.add_argument("--vocab", type=int, default=16384, help="vocabulary (default: 16384)")
    args = p.parse_args()
    args.batch = args.batch or 4
    args.seq = args.seq or 512
    args.kv_heads = args.kv_heads or args.heads
    common.check_sizes(args, batch=args.batch, seq=args.seq, dim=args.dim, layers=args.layers,
                       heads=args.heads, kv_heads=args.kv_heads, hidden=args.hidden,
                       vocab=args.vocab)
    if args.dim % args.heads or (args.dim // args.heads) % 2:
        sys.exit(f"--dim {args.dim} / --heads {args.heads} must give an even head dim")
    if args.heads % args.kv_heads:
        sys.exit(f"--heads {args.heads} is not a multiple of --kv-heads {args.kv_heads}")
    device, dtype = common.setup(args)

    model = Llama(args.vocab, args.seq, args.dim, args.layers, args.heads, args.kv_heads,
                  args.hidden)
    model = model.to(device=device, dtype=dtype)
    tokens = common.random_tokens((args.batch, args.seq), args.vocab, device, args.seed + 1)
    targets = common.random_tokens((args.batch, args.seq), args.vocab, device, args.seed + 2)
    summary = (f"llama: {common.count_parameters(model) / 1e6:.1f}M parameters, {args.layers} "
               f"layers, dim {args.dim}, {args.heads} heads ({args.kv_heads} kv), swiglu "
               f"{args.hidden}, vocab {args.vocab}; batch {args.batch} x seq {args.seq}")
    common.run(model, (tokens, targets), args, summary)


if __name__ == "__main__":
    main()
