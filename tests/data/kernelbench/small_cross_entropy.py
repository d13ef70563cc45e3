# Mean cross-entropy of bf16 logits: an integer input and a scalar output.
import torch
import torch.nn as nn
import torch.nn.functional as F

KFORGE_OP = "cross_entropy"


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits, targets):
        return F.cross_entropy(logits, targets, ignore_index=-100)


def get_inputs():
    return [torch.randn(128, 4096, dtype=torch.bfloat16), torch.randint(0, 4096, (128,))]


def get_init_inputs():
    return []
