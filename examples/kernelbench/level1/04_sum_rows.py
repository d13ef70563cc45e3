# Sum over the last dimension, float32.
import torch
import torch.nn as nn

KFORGE_OP = "reduce"  # x[M, N] -> y[M]


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x.sum(dim=-1)


M, N = 8192, 4096


def get_inputs():
    return [torch.randn(M, N)]


def get_init_inputs():
    return []
