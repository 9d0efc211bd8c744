"""ResNet-18/34/50 for image classification, torchvision's architecture and names.

ResNet-18 and -34 stack ``BasicBlock`` (two 3x3 convs); ResNet-50 stacks
``Bottleneck`` (1x1 reduce, 3x3, 1x1 expand by 4) in the v1.5 form that
torchvision and NVIDIA/DLPerf use: a stage's stride 2 sits in the 3x3 conv,
not in the first 1x1 (v1), which costs a little speed and buys ~0.5% top-1.

Every parameter and buffer has torchvision's name (``conv1``, ``bn1``,
``layer1.0.conv1``, ``layer2.0.downsample.0``/``.1``, ``fc``), so a
torchvision state dict loads one to one::

    from pyflow.models import resnet
    model = resnet.resnet50()
    model.load_state_dict({k: pyflow.tensor(v.numpy()) for k, v in sd.items()})
"""
from pyflow import nn

__all__ = ["BasicBlock", "Bottleneck", "ResNet", "resnet18", "resnet34", "resnet50"]


def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class BasicBlock(nn.Module):
    """x + bn2(conv2(relu(bn1(conv1(x))))), then relu (ResNet-18/34)."""
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU()
        self.conv2 = conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample    # matches the shortcut's shape to the block's output
        self.stride = stride

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    """1x1 reduce -> 3x3 (carries the stride: v1.5) -> 1x1 expand, plus the shortcut."""
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU()
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """Stem (7x7/2 conv, 3x3/2 max pool), four stages of ``block`` at widths
    64, 128, 256, 512 (stages 2-4 halve the resolution), global average pool, fc.

    ``layers`` is the number of blocks per stage ((2, 2, 2, 2) for ResNet-18).
    ``zero_init_residual`` starts every block's last BN gamma at 0, so each
    residual branch starts as the identity (Goyal et al., 2017), as torchvision.
    ``width`` is the stem's and first stage's channel count (64 in the paper;
    not a torchvision argument): smaller values give test-sized nets.
    """

    def __init__(self, block, layers, num_classes=1000, zero_init_residual=False, width=64):
        super().__init__()
        if len(layers) != 4:
            raise ValueError(f"ResNet: layers must give the number of blocks of the 4 stages, "
                             f"got {layers!r}")
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], stride=2)
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)

        # torchvision's init: He-normal convs (fan_out), BN at gamma 1, beta 0; fc keeps
        # nn.Linear's default.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.zeros_(m.bn3.weight)
                elif isinstance(m, BasicBlock):
                    nn.init.zeros_(m.bn2.weight)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * block.expansion, stride),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        if x.ndim != 4 or x.shape[1] != 3:
            raise ValueError(f"ResNet: expected input of shape (N, 3, H, W), got "
                             f"{tuple(x.shape)}")
        if not x.dtype.is_floating_point:
            raise TypeError(f"ResNet: expected a floating point input (N, 3, H, W), got "
                            f"{x.dtype}")
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        # Global average pool: torchvision's AdaptiveAvgPool2d((1, 1)) + flatten, as one mean
        # (pyflow's adaptive_avg_pool2d cannot be traced into an nn.Graph yet).
        return self.fc(x.mean((2, 3)))


def resnet18(num_classes=1000, **kwargs):
    """ResNet-18: 11,689,512 parameters at 1000 classes."""
    return ResNet(BasicBlock, (2, 2, 2, 2), num_classes=num_classes, **kwargs)


def resnet34(num_classes=1000, **kwargs):
    """ResNet-34: 21,797,672 parameters at 1000 classes."""
    return ResNet(BasicBlock, (3, 4, 6, 3), num_classes=num_classes, **kwargs)


def resnet50(num_classes=1000, **kwargs):
    """ResNet-50 v1.5: 25,557,032 parameters at 1000 classes."""
    return ResNet(Bottleneck, (3, 4, 6, 3), num_classes=num_classes, **kwargs)
