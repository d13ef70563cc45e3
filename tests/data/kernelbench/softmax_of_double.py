# A problem whose Model is not quite its KFORGE_OP: softmax(2x). kforge's softmax kernels are
# correct for softmax(x) only, so checked against this Model they must fail.
import torch
import torch.nn as nn

KFORGE_OP = "softmax"


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(2 * x, dim=-1)


def get_inputs():
    return [torch.randn(256, 1024)]


def get_init_inputs():
    return []
