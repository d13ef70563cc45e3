# A problem as KernelBench publishes them: no KFORGE_OP. Its tensors fit rmsnorm's signature
# (x[M, N], the Model's weight[N], out[M, N]) and its Model computes RMSNorm, so kforge takes it
# as rmsnorm.
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(features) + 0.5)
        self.eps = 1e-6

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def get_inputs():
    return [torch.randn(128, 512)]


def get_init_inputs():
    return [512]
