# Rotary position embedding, interleaved pairs (x[2i], x[2i + 1]), float32.
import torch
import torch.nn as nn

KFORGE_OP = "rotary_embedding"  # x[b, h, s, d], cos[s, d/2], sin[s, d/2] -> y


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, cos, sin):
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


batch, heads, seq, dim = 1, 32, 2048, 128


def get_inputs():
    angles = torch.rand(seq, dim // 2) * 6.283185307179586
    return [torch.randn(batch, heads, seq, dim), angles.cos(), angles.sin()]


def get_init_inputs():
    return []
