"""A user-defined model for tether: a small CNN (two conv layers) for
28x28 grey images such as Fashion-MNIST. Nothing here knows about tether;
`python3 -m tether.worker --model cnn.py:Net` trains it on a tether run."""

from torch import nn


class Net(nn.Module):
    def __init__(self, channels=16, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, channels, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(channels, 2 * channels, 5, padding=2), nn.ReLU(),
            nn.MaxPool2d(2))
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(2 * channels * 7 * 7, 128), nn.ReLU(),
            nn.Linear(128, classes))

    def forward(self, x):
        return self.classifier(self.features(x))
