"""Data-parallel training: one process per device, gradients averaged over ranks in buckets during backward."""
from .allreduce import AllReduce, StoreAllReduce
from .buckets import DEFAULT_BUCKET_BYTES, Bucket, plan_buckets
from .group import ProcessGroup
from .rendezvous import Rendezvous, RendezvousError
from .sync import GradientSync, data_parallel

__all__ = ["AllReduce", "Bucket", "DEFAULT_BUCKET_BYTES", "GradientSync", "ProcessGroup", "Rendezvous",
           "RendezvousError", "StoreAllReduce", "data_parallel", "plan_buckets"]
