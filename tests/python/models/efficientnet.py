"""EfficientNet-B0 written as the public efficientnet_pytorch package writes it (written here for
opfuse's tests): Swish as a memory-efficient custom autograd Function, a squeeze-and-excitation
gate sigmoid(s) * x inline, BatchNorm (momentum 0.01, eps 1e-3), drop connect in a free function
called with a per-block rate, one Swish module shared by a block's activations.

    python3 -m opfuse tune tests/python/models/efficientnet.py:factory
"""
import math

import torch
from torch import nn
from torch.nn import functional as F


class SwishImplementation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, i):
        result = i * torch.sigmoid(i)
        ctx.save_for_backward(i)
        return result

    @staticmethod
    def backward(ctx, grad_output):
        i = ctx.saved_tensors[0]
        sigmoid_i = torch.sigmoid(i)
        return grad_output * (sigmoid_i * (1 + i * (1 - sigmoid_i)))


class MemoryEfficientSwish(nn.Module):
    def forward(self, x):
        return SwishImplementation.apply(x)


def drop_connect(inputs, p, training):
    assert 0 <= p <= 1, "p must be in range of [0, 1]"
    if not training:
        return inputs
    batch_size = inputs.shape[0]
    keep_prob = 1 - p
    random_tensor = keep_prob
    random_tensor += torch.rand([batch_size, 1, 1, 1], dtype=inputs.dtype, device=inputs.device)
    binary_tensor = torch.floor(random_tensor)
    return inputs / keep_prob * binary_tensor


def round_filters(filters, width=1.0, divisor=8):
    filters *= width
    new = max(divisor, int(filters + divisor / 2) // divisor * divisor)
    if new < 0.9 * filters:
        new += divisor
    return int(new)


class Conv2dStaticSamePadding(nn.Conv2d):
    """TensorFlow's "SAME" padding for a fixed image size."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, groups=1, bias=False, image_size=None):
        super().__init__(in_channels, out_channels, kernel_size, stride, groups=groups, bias=bias)
        ih = iw = image_size
        kh, kw = self.weight.shape[-2:]
        sh, sw = self.stride
        oh, ow = math.ceil(ih / sh), math.ceil(iw / sw)
        pad_h = max((oh - 1) * sh + kh - ih, 0)
        pad_w = max((ow - 1) * sw + kw - iw, 0)
        if pad_h > 0 or pad_w > 0:
            self.static_padding = nn.ZeroPad2d((pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))
        else:
            self.static_padding = nn.Identity()

    def forward(self, x):
        return F.conv2d(self.static_padding(x), self.weight, self.bias, self.stride, self.padding, self.dilation,
                        self.groups)


class MBConvBlock(nn.Module):
    def __init__(self, kernel, stride, expand_ratio, input_filters, output_filters, se_ratio, image_size):
        super().__init__()
        self.stride, self.expand_ratio = stride, expand_ratio
        self.id_skip = stride == 1 and input_filters == output_filters
        bn = dict(momentum=0.01, eps=1e-3)
        oup = input_filters * expand_ratio
        if expand_ratio != 1:
            self._expand_conv = Conv2dStaticSamePadding(input_filters, oup, 1, image_size=image_size)
            self._bn0 = nn.BatchNorm2d(oup, **bn)
        self._depthwise_conv = Conv2dStaticSamePadding(oup, oup, kernel, stride, groups=oup, image_size=image_size)
        self._bn1 = nn.BatchNorm2d(oup, **bn)
        squeezed = max(1, int(input_filters * se_ratio))
        self._se_reduce = Conv2dStaticSamePadding(oup, squeezed, 1, bias=True, image_size=1)
        self._se_expand = Conv2dStaticSamePadding(squeezed, oup, 1, bias=True, image_size=1)
        self._project_conv = Conv2dStaticSamePadding(oup, output_filters, 1, image_size=math.ceil(image_size / stride))
        self._bn2 = nn.BatchNorm2d(output_filters, **bn)
        self._swish = MemoryEfficientSwish()

    def forward(self, inputs, drop_connect_rate=None):
        x = inputs
        if self.expand_ratio != 1:
            x = self._expand_conv(inputs)
            x = self._bn0(x)
            x = self._swish(x)
        x = self._depthwise_conv(x)
        x = self._bn1(x)
        x = self._swish(x)
        x_squeezed = F.adaptive_avg_pool2d(x, 1)
        x_squeezed = self._se_reduce(x_squeezed)
        x_squeezed = self._swish(x_squeezed)
        x_squeezed = self._se_expand(x_squeezed)
        x = torch.sigmoid(x_squeezed) * x
        x = self._project_conv(x)
        x = self._bn2(x)
        if self.id_skip:
            if drop_connect_rate:
                x = drop_connect(x, p=drop_connect_rate, training=self.training)
            x = x + inputs
        return x


# B0: (repeats, kernel, stride, expand, in, out, se)
B0_BLOCKS = [(1, 3, 1, 1, 32, 16, 0.25), (2, 3, 2, 6, 16, 24, 0.25), (2, 5, 2, 6, 24, 40, 0.25),
             (3, 3, 2, 6, 40, 80, 0.25), (3, 5, 1, 6, 80, 112, 0.25), (4, 5, 2, 6, 112, 192, 0.25),
             (1, 3, 1, 6, 192, 320, 0.25)]


class EfficientNet(nn.Module):
    def __init__(self, image_size=224, num_classes=1000, drop_connect_rate=0.2, dropout=0.2):
        super().__init__()
        bn = dict(momentum=0.01, eps=1e-3)
        self.drop_connect_rate = drop_connect_rate
        self._conv_stem = Conv2dStaticSamePadding(3, 32, 3, 2, image_size=image_size)
        self._bn0 = nn.BatchNorm2d(32, **bn)
        size = math.ceil(image_size / 2)
        self._blocks = nn.ModuleList()
        for repeats, k, s, e, i, o, se in B0_BLOCKS:
            for r in range(repeats):
                self._blocks.append(MBConvBlock(k, s if r == 0 else 1, e, i if r == 0 else o, o, se, size))
                size = math.ceil(size / (s if r == 0 else 1))
        self._conv_head = Conv2dStaticSamePadding(320, 1280, 1, image_size=size)
        self._bn1 = nn.BatchNorm2d(1280, **bn)
        self._avg_pooling = nn.AdaptiveAvgPool2d(1)
        self._dropout = nn.Dropout(dropout)
        self._fc = nn.Linear(1280, num_classes)
        self._swish = MemoryEfficientSwish()

    def extract_features(self, inputs):
        x = self._swish(self._bn0(self._conv_stem(inputs)))
        for idx, block in enumerate(self._blocks):
            rate = self.drop_connect_rate
            if rate:
                rate *= float(idx) / len(self._blocks)
            x = block(x, drop_connect_rate=rate)
        return self._swish(self._bn1(self._conv_head(x)))

    def forward(self, inputs):
        x = self.extract_features(inputs)
        x = self._avg_pooling(x).flatten(start_dim=1)
        return self._fc(self._dropout(x))


def factory(image_size=96, batch_size=16, num_classes=1000, seed=0):
    """(model, inputs, loss_fn) for `python3 -m opfuse tune efficientnet.py:factory`."""
    torch.manual_seed(seed)
    model = EfficientNet(image_size=image_size, num_classes=num_classes)
    images = torch.randn(batch_size, 3, image_size, image_size)
    labels = torch.randint(num_classes, (batch_size,))
    return model, (images,), lambda out: F.cross_entropy(out, labels)
