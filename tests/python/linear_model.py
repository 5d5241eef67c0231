"""A small model for `python3 -m tether.worker` in the tests: a linear
classifier of 784-pixel images, flat (--input-shape 784) or not."""

import torch


class Net(torch.nn.Module):
    def __init__(self, features=784, classes=10):
        super().__init__()
        self.fc = torch.nn.Linear(features, classes)

    def forward(self, x):
        return self.fc(x.flatten(1))
