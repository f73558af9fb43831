"""A small EfficientNet-like network written as people write it in Python: conv, BatchNorm, Swish
as x * sigmoid(x), a squeeze-and-excitation gate x * sigmoid(g), a residual; scripted and saved
for `opfuse rewrite` and `opfuse tune --model FILE.pt`.

    python3 tiny_effnet.py OUT.pt
"""
import sys

import torch
from torch import nn


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class Block(nn.Module):
    def __init__(self, channels, squeezed):
        super().__init__()
        self.expand = nn.Conv2d(channels, channels * 4, 1, bias=False)
        self.bn0 = nn.BatchNorm2d(channels * 4)
        self.depthwise = nn.Conv2d(channels * 4, channels * 4, 3, padding=1, groups=channels * 4, bias=False)
        self.bn1 = nn.BatchNorm2d(channels * 4)
        self.se_reduce = nn.Conv2d(channels * 4, squeezed, 1)
        self.se_expand = nn.Conv2d(squeezed, channels * 4, 1)
        self.project = nn.Conv2d(channels * 4, channels, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.swish = Swish()

    def forward(self, inputs):
        x = self.swish(self.bn0(self.expand(inputs)))
        x = self.swish(self.bn1(self.depthwise(x)))
        s = torch.nn.functional.adaptive_avg_pool2d(x, 1)
        s = self.se_expand(self.swish(self.se_reduce(s)))
        x = torch.sigmoid(s) * x
        return self.bn2(self.project(x)) + inputs


class TinyEffNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.blocks = nn.Sequential(Block(16, 4), Block(16, 4))
        self.fc = nn.Linear(16, num_classes)

    def forward(self, x):
        x = self.bn(self.stem(x))
        x = x * torch.sigmoid(x)
        x = self.blocks(x)
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.jit.script(TinyEffNet()).save(sys.argv[1])
