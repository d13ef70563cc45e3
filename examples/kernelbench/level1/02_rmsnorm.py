# RMSNorm with a learned scale (Llama's), float32.
import torch
import torch.nn as nn

KFORGE_OP = "rmsnorm"  # x[M, N], weight[N] -> y[M, N]; kforge passes eps = 1e-6


class Model(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x):
        scale = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return x * scale * self.weight


M, N = 4096, 4096


def get_inputs():
    return [torch.randn(M, N)]


def get_init_inputs():
    return [N, 1e-6]
