"""The MLP of tether-worker --model mlp (784-256-128-10, ReLU) as a PyTorch
module, for tools/bench/python_client: `--model mlp_torch.py:Mlp`."""

from torch import nn


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
            nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x):
        return self.layers(x)
