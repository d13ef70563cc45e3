# Softmax over long bf16 rows (a vocabulary's logits).
import torch
import torch.nn as nn

KFORGE_OP = "softmax"  # x[rows, cols] -> y[rows, cols]


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)


rows, cols = 1024, 32768


def get_inputs():
    return [torch.randn(rows, cols, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
