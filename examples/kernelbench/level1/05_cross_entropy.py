# Mean cross-entropy of float32 logits against class indices.
import torch
import torch.nn as nn
import torch.nn.functional as F

KFORGE_OP = "cross_entropy"  # logits[batch, vocab], targets[batch] (int64) -> loss[]


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits, targets):
        return F.cross_entropy(logits, targets, ignore_index=-100)


batch, vocab = 2048, 32000


def get_inputs():
    return [torch.randn(batch, vocab), torch.randint(0, vocab, (batch,))]


def get_init_inputs():
    return []
