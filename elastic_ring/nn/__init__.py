"""Neural networks: the CIFAR ResNets of He et al. 2016."""

from elastic_ring.nn.resnet import CifarResNet, resnet, count_parameters, DEPTHS

__all__ = ["CifarResNet", "resnet", "count_parameters", "DEPTHS"]
