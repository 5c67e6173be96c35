"""The layer library: every weight goes through an ETP op, every carried state is a
``brainstate.HiddenState``. One call of a layer is one time step.

Read ``linear.py`` for the simplest layer and ``spiking.py`` for neuron dynamics.
"""

from .basic import (GELU, Activation, AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool1d, AdaptiveMaxPool2d,
                    AvgPool1d, AvgPool2d, BatchNorm, BatchNorm1d, BatchNorm2d, GroupNorm, LayerNorm,
                    LeakyReLU, MaxPool1d, MaxPool2d, ReLU, RMSNorm, SiLU, Softplus, Tanh)
from .dropout import Dropout
from .linear import Conv1d, Conv2d, Conv3d, Embedding, Flatten, Linear, LoRALinear, SparseLinear
from .readout import LeakyRateReadout, LeakySpikeReadout
from .rnn import GRUCell, LSTMCell, MGUCell, MinGRUCell, MinimalRNNCell, MinLSTMCell, URLSTMCell, VanillaRNNCell
from .sequential import Sequential
from .base import Constrained, Neuron, SpikingLayer, decay, parameter, read, time_constant, training
from .lru import LRU
from .spiking import ALIF, IF, LIF, RecurrentALIF, RecurrentLIF
from .synapses import STP, AlphaSynapse, DualExpSynapse, ExpSynapse
from .surrogate import FastSigmoid, Sigmoid, Surrogate, Triangle, get_surrogate

__all__ = [
    "ALIF",
    "Activation",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AvgPool1d",
    "AvgPool2d",
    "BatchNorm",
    "BatchNorm1d",
    "BatchNorm2d",
    "GroupNorm",
    "GELU",
    "LayerNorm",
    "LeakyReLU",
    "MGUCell",
    "MaxPool1d",
    "MaxPool2d",
    "MinGRUCell",
    "MinLSTMCell",
    "MinimalRNNCell",
    "RMSNorm",
    "ReLU",
    "SiLU",
    "Softplus",
    "Tanh",
    "URLSTMCell",
    "AlphaSynapse",
    "DualExpSynapse",
    "Dropout",
    "Embedding",
    "ExpSynapse",
    "IF",
    "LRU",
    "STP",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "FastSigmoid",
    "Flatten",
    "GRUCell",
    "LIF",
    "LSTMCell",
    "LeakyRateReadout",
    "LeakySpikeReadout",
    "Neuron",
    "RecurrentALIF",
    "RecurrentLIF",
    "Linear",
    "LoRALinear",
    "SparseLinear",
    "Sequential",
    "Sigmoid",
    "SpikingLayer",
    "Surrogate",
    "Triangle",
    "VanillaRNNCell",
    "decay",
    "get_surrogate",
    "parameter",
    "read",
    "time_constant",
    "Constrained",
    "training",
]
