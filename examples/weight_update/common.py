"""What the trainer and the rollouts share: the import of sharedtensor
from this repository, the model, its checksum, the names of the shared
state."""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "python"))
sys.path.insert(0, here)

import torch  # noqa: E402

KEY = "weight_update/policy"      # live key: the model's weights, updated in place
SUMS = "weight_update/sums"       # live key {"sums": float64 [STEPS + 2]}: [0] the last
                                  # version, [v] the weights' version v's checksum
HIDDEN, LAYERS = 1024, 4          # 4 x (1024 x 1024 + 1024) float32: 16 MiB


def model(device):
    """The policy: a stack of Linear + tanh layers."""
    layers = []
    for _ in range(LAYERS):
        layers += [torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers).to(device)


def checksum(m):
    """One float64 of every parameter, each weighted by its position, so
    that parameters of two versions mixed give neither version's sum.
    Deterministic for the same values on the same device."""
    total = torch.zeros((), dtype=torch.float64, device=next(m.parameters()).device)
    for i, p in enumerate(m.parameters()):
        total += p.detach().double().sum() * (i + 1)
    return float(total)


def read_sums(sums, timeout=10):
    """A copy of the checksum table, read from live key handle `sums` as
    one version."""
    while True:
        seq = sums.read_begin(timeout=timeout)
        table = sums.tensors["sums"].clone()
        if sums.read_end(seq):
            return table


def sync(device):
    """This process's CUDA work is complete."""
    if device != "cpu":
        torch.cuda.synchronize()
