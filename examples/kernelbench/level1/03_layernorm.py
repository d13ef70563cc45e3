# LayerNorm over the last dimension with weight and bias, float32.
import torch
import torch.nn as nn

KFORGE_OP = "layernorm"  # x[batch, dim], weight[dim], bias[dim] -> y; kforge passes eps = 1e-5


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-5)
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.1)
            self.norm.bias.normal_(0.0, 0.1)

    def forward(self, x):
        return self.norm(x)


batch, dim = 4096, 2048


def get_inputs():
    return [torch.randn(batch, dim)]


def get_init_inputs():
    return [dim]
