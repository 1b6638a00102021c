"""The reserved names, defined once: annotation keys, the env names the webhook injects, the resource, the prefixes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from contract.settings import Contract

DEFAULT_RESOURCE: Final = "aliyun.com/gpu-mem"
# The node capacity the device plugin (ours, and the reference one: pkg/gpu/nvidia/const.go, CountName) publishes
# beside the memory resource: how many GPUs the node has.
GPU_COUNT: Final = "aliyun.com/gpu-count"
DEFAULT_PREFIX: Final = "gpushare.io/"
# The DRA driver name: ResourceSlice spec.driver, allocation results' driver, the kubelet plugin's registered name
# (a DNS subdomain of at most 63 characters, resource.k8s.io/v1 ResourceSliceSpec.Driver).
DRA_DRIVER: Final = "gpushare.io"

# The prefix of every compatible key and env name: all of them are reserved to gpushare.
COMPAT_PREFIX: Final = "ALIYUN_COM_GPU_MEM_"
# Compatible keys, written by the scheduler extender (or by the plugin in node-local placement).
IDX: Final = "ALIYUN_COM_GPU_MEM_IDX"
DEV: Final = "ALIYUN_COM_GPU_MEM_DEV"
POD: Final = "ALIYUN_COM_GPU_MEM_POD"
ASSUME_TIME: Final = "ALIYUN_COM_GPU_MEM_ASSUME_TIME"
ASSIGNED: Final = "ALIYUN_COM_GPU_MEM_ASSIGNED"
COMPAT_KEYS: Final = (IDX, DEV, POD, ASSUME_TIME, ASSIGNED)
# IDX/DEV/POD feed the containers' environment through the downward API, so they are frozen once bound.
PLACEMENT_KEYS: Final = (IDX, DEV, POD)

# Environment variables the webhook injects into GPU-share containers in `env` delivery mode.
ENV_VISIBLE: Final = "NVIDIA_VISIBLE_DEVICES"
ENV_CUDA_VISIBLE: Final = "CUDA_VISIBLE_DEVICES"
ENV_IDX: Final = IDX
ENV_DEV: Final = DEV
ENV_CONTAINER: Final = "ALIYUN_COM_GPU_MEM_CONTAINER"
ENV_POD: Final = POD
RESERVED_ENV: Final = (ENV_VISIBLE, ENV_CUDA_VISIBLE, ENV_IDX, ENV_DEV, ENV_CONTAINER, ENV_POD)


def is_reserved_annotation(key: str, contract: Contract) -> bool:
    return key.startswith(COMPAT_PREFIX) or key.startswith(contract.prefix)
