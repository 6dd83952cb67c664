"""Convolutional models as layer profiles: what each layer holds, computes and sends, from its architecture.

HetPipe (Park et al. 2020, `../shared/seeds/004_*`) trains VGG-19 and ResNet-152 on ImageNet
(224 x 224 x 3 images). Its partitioner needs, per layer, the parameters, the FLOPs, the
activation it sends to the next layer and the activation memory it keeps for its backward;
here they are computed from the architectures as torchvision defines them (vgg19: Simonyan &
Zisserman 2015, configuration E; resnet152: He et al. 2016, bottleneck blocks [3, 8, 36, 3]
with the stride on the 3x3 convolution, v1.5), not typed in from a paper.

Units of partitioning: VGG-19's convolution+ReLU, pooling and fully connected layers; ResNet-152's
stem, each bottleneck block and the head (a cut inside a residual block would send both of its
paths; HetPipe's figures partition at layer granularity, which for ResNet is the block).
FLOPs: 2 per multiply-add of convolutions and fully connected layers; element-wise layers
(BatchNorm, ReLU, pooling, the residual add) count none (memory-bound and a few per value).
Kept activations: the values a layer's backward reads, as a framework without in-place ops
keeps them (TensorFlow 1.x, HetPipe's): a convolution's output (BatchNorm's input), BatchNorm's
or ReLU's output, a pooling's output; the layer's input is counted by the layer before it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..compute import conv_flop
from ..errors import HarnessError
from .layers import Layer, LayerProfile

IMAGE = (3, 224, 224)  # ImageNet crops, channels first
CLASSES = 1000


class CNNError(HarnessError, ValueError):
    """Unknown CNN model; str() is one line."""


IMAGE_VALUES = IMAGE[0] * IMAGE[1] * IMAGE[2]


def _conv(cin: int, cout: int, k: int, h_out: int, bias: bool) -> tuple[int, float]:
    """(parameters, forward FLOPs per sample) of a k x k convolution with an h_out x h_out output."""
    params = k * k * cin * cout + (cout if bias else 0)
    return params, conv_flop(cin, cout, k, k, h_out, h_out)


# ----------------------------------------------------------------------------- VGG-19
VGG19_CONFIG = (64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
                512, 512, 512, 512, "M")  # configuration E: 3x3 convolutions (padding 1), "M" 2x2 max-pool


def vgg19() -> LayerProfile:
    layers, c, h = [], IMAGE[0], IMAGE[1]
    for k, v in enumerate(VGG19_CONFIG):
        if v == "M":
            h //= 2
            layers.append(Layer(f"pool{k}", 0, 0.0, c * h * h, c * h * h))
        else:
            p, f = _conv(c, v, 3, h, bias=True)
            c = v
            layers.append(Layer(f"conv{k}", p, f, c * h * h, c * h * h))  # ReLU's output (the conv's is not read)
    features = c * 7 * 7  # adaptive average pool to 7 x 7: identity at 224 x 224
    for k, (fin, fout) in enumerate(((features, 4096), (4096, 4096), (4096, CLASSES))):
        last = fout == CLASSES
        layers.append(Layer(f"fc{k}", fin * fout + fout, 2.0 * fin * fout, fout,
                            fout if last else 2 * fout))  # ReLU's output and dropout's mask
    return LayerProfile("vgg19", tuple(layers), IMAGE_VALUES)


# ----------------------------------------------------------------------------- ResNet-152
RESNET152_BLOCKS = (3, 8, 36, 3)


def resnet152() -> LayerProfile:
    h = IMAGE[1] // 2  # 7x7 stride-2 stem convolution: 112 x 112
    p, f = _conv(IMAGE[0], 64, 7, h, bias=False)
    stem_kept = 2 * 64 * h * h  # conv output (BatchNorm's input), ReLU output
    h //= 2  # 3x3 stride-2 max-pool: 56 x 56
    layers = [Layer("stem", p + 2 * 64, f, 64 * h * h, stem_kept + 64 * h * h)]
    cin = 64
    for stage, (blocks, width) in enumerate(zip(RESNET152_BLOCKS, (64, 128, 256, 512))):
        for b in range(blocks):
            stride = 2 if (b == 0 and stage > 0) else 1
            h_in, h_out = h, h // stride
            cout = 4 * width
            p1, f1 = _conv(cin, width, 1, h_in, bias=False)
            p2, f2 = _conv(width, width, 3, h_out, bias=False)
            p3, f3 = _conv(width, cout, 1, h_out, bias=False)
            params = p1 + p2 + p3 + 2 * (width + width + cout)  # BatchNorm: scale and shift per channel
            flop = f1 + f2 + f3
            kept = 2 * width * h_in * h_in + 2 * width * h_out * h_out + 2 * cout * h_out * h_out
            if b == 0:  # projection shortcut (1x1, stride) with its BatchNorm
                pd, fd = _conv(cin, cout, 1, h_out, bias=False)
                params += pd + 2 * cout
                flop += fd
                kept += 2 * cout * h_out * h_out
            kept += cout * h_out * h_out  # the residual sum's ReLU
            layers.append(Layer(f"block{stage + 1}.{b}", params, flop, cout * h_out * h_out, kept))
            cin, h = cout, h_out
    layers.append(Layer("head", cin * CLASSES + CLASSES, 2.0 * cin * CLASSES, CLASSES, cin + CLASSES))
    return LayerProfile("resnet152", tuple(layers), IMAGE_VALUES)


# ----------------------------------------------------------------------------- small-resnet
#: The CNN a CPU trains for real (harness/train/cnn.py builds it from these): HetPipe's layer types at a
#: size whose minibatch takes milliseconds. Units: stem conv, residual block, 2 x 2 max-pool, residual block
#: with a 1 x 1 projection shortcut, max-pool, residual block, fully connected head on the flattened map.
SMALL_IMAGE = (3, 16, 16)
SMALL_CLASSES = 10
SMALL_WIDTHS = (16, 32)
SMALL_UNITS = ("stem", "block1", "pool1", "block2", "pool2", "block3", "head")


def small_resnet() -> LayerProfile:
    (a, b), h = SMALL_WIDTHS, SMALL_IMAGE[1]
    layers = []
    p, f = _conv(SMALL_IMAGE[0], a, 3, h, bias=True)
    layers.append(Layer("stem", p, f, a * h * h, 2 * a * h * h))  # conv output, ReLU output

    def block(name: str, cin: int, cout: int, h: int) -> Layer:
        p1, f1 = _conv(cin, cout, 3, h, bias=True)
        p2, f2 = _conv(cout, cout, 3, h, bias=True)
        params, flop, kept = p1 + p2, f1 + f2, 4 * cout * h * h  # two conv outputs, inner ReLU, sum's ReLU
        if cin != cout:
            ps, fs = _conv(cin, cout, 1, h, bias=True)
            params, flop, kept = params + ps, flop + fs, kept + cout * h * h
        return Layer(name, params, flop, cout * h * h, kept)

    layers.append(block("block1", a, a, h))
    h //= 2
    layers.append(Layer("pool1", 0, 0.0, a * h * h, a * h * h))
    layers.append(block("block2", a, b, h))
    h //= 2
    layers.append(Layer("pool2", 0, 0.0, b * h * h, b * h * h))
    layers.append(block("block3", b, b, h))
    fin = b * h * h
    layers.append(Layer("head", fin * SMALL_CLASSES + SMALL_CLASSES, 2.0 * fin * SMALL_CLASSES, SMALL_CLASSES,
                        SMALL_CLASSES))
    assert tuple(l.name for l in layers) == SMALL_UNITS
    return LayerProfile("small-resnet", tuple(layers), SMALL_IMAGE[0] * SMALL_IMAGE[1] * SMALL_IMAGE[2])


CNN_MODELS = {"vgg19": vgg19, "resnet152": resnet152, "small-resnet": small_resnet}
#: the CNNs `harness run` trains for real (on a CPU: harness/train/cnn.py), on the teacher-labelled images
TRAINABLE_CNNS = ("small-resnet",)
CNN_DATA_SETS = ("teacher",)


def is_cnn(name: str) -> bool:
    return name in CNN_MODELS


def get_cnn(name: str) -> LayerProfile:
    if name not in CNN_MODELS:
        raise CNNError(f"--model: unknown CNN {name!r} (known: {', '.join(CNN_MODELS)})")
    return CNN_MODELS[name]()
