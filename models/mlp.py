"""A multi-layer perceptron, the smallest model of the zoo."""
from pyflow import nn


class MLP(nn.Module):
    def __init__(self, in_features=784, hidden=(256, 256), num_classes=10, dropout=0.0):
        super().__init__()
        layers, width = [nn.Flatten()], in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU()]
            if dropout:
                layers.append(nn.Dropout(dropout))
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)
