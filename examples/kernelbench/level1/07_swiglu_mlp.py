# A Llama-style SwiGLU MLP in bf16: down(silu(gate(x)) * up(x)), no biases.
import torch
import torch.nn as nn
import torch.nn.functional as F

KFORGE_OP = "fused_mlp"  # x[batch, dim], w_gate[hidden, dim], w_up[hidden, dim], w_down[dim, hidden]


class Model(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate = nn.Linear(dim, hidden, bias=False, dtype=torch.bfloat16)
        self.up = nn.Linear(dim, hidden, bias=False, dtype=torch.bfloat16)
        self.down = nn.Linear(hidden, dim, bias=False, dtype=torch.bfloat16)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


batch, dim, hidden = 2048, 2048, 5632


def get_inputs():
    return [torch.randn(batch, dim, dtype=torch.bfloat16)]


def get_init_inputs():
    return [dim, hidden]
