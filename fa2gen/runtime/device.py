"""What the current GPU is: arch, name, capability. Cached per device index."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import torch

from ..generator.arch import arch_from_capability


@dataclass(frozen=True)
class DeviceInfo:
    name: str  # normalised, file-name safe: "NVIDIA_H200"
    capability: tuple[int, int]
    arch: str
    sm_count: int


def normalise_device_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


@functools.lru_cache(maxsize=None)
def cuda_device_info(index: int) -> DeviceInfo:
    props = torch.cuda.get_device_properties(index)
    cap = (props.major, props.minor)
    return DeviceInfo(
        name=normalise_device_name(props.name),
        capability=cap,
        arch=arch_from_capability(*cap),
        sm_count=props.multi_processor_count,
    )
