# A bf16 matrix product with float32 accumulation (as torch.matmul does).
import torch
import torch.nn as nn

KFORGE_OP = "matmul"  # A[M, K], B[K, N] -> C[M, N]


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


M, K, N = 2048, 4096, 2048


def get_inputs():
    return [torch.randn(M, K, dtype=torch.bfloat16), torch.randn(K, N, dtype=torch.bfloat16)]


def get_init_inputs():
    return []
