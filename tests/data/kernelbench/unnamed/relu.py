# No KFORGE_OP, and a signature softmax also has (x[M, N] -> out[M, N]), but its Model is a
# ReLU: kforge must refuse it rather than take it as softmax.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return []
