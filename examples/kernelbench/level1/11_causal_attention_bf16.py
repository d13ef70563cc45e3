# Causal scaled dot-product attention in bf16 (scale 1/sqrt(head_dim)).
import torch
import torch.nn as nn
import torch.nn.functional as F

KFORGE_OP = "flash_attention"  # Q, K, V [batch, heads, seq, head_dim] -> O; causal, default scale


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


batch, heads, seq, head_dim = 2, 16, 1024, 128


def get_inputs():
    return [torch.randn(batch, heads, seq, head_dim, dtype=torch.bfloat16) for _ in range(3)]


def get_init_inputs():
    return []
