"""Cluster cost model of AGoQ: peak memory per pipeline stage and step time, baseline vs AGoQ.

Quick start::

    from agoq_core.scale import Parallel, parse_cluster, predict
    cl = parse_cluster("64xA6000", inter="200Gbps")
    p = predict("llama2-13b", cl, Parallel(tp=8, pp=4, dp=2, schedule="1f1b", microbatches=8), 65536)
    print(p.baseline.time.total, p.agoq.time.total, p.speedup)

``agoq plan --cluster 64xA6000 --inter 200Gbps --tp 8 --pp 4 --dp 2 --model llama2-13b --seq-len 65536``
prints the same. Every number is a prediction (alpha-beta collectives, a roofline calibrated by the
H200 measurements in docs/benchmarks.md); docs/scale.md checks it against the paper's tables.
"""
from agoq_core.scale.collectives import Group, collective_time, quangrad_allreduce_time
from agoq_core.scale.config import Cluster, Parallel, parse_cluster
from agoq_core.scale.devices import DEVICES, DeviceProfile, device_profile
from agoq_core.scale.errors import ScaleError
from agoq_core.scale.network import INTER_LINKS, INTRA_LINKS, Link, NetworkProfile, load_profile, network_for, parse_rate
from agoq_core.scale.step import ArmPrediction, Prediction, StepTime, predict

__all__ = [
    # the verb
    "predict",
    "Prediction",
    "ArmPrediction",
    "StepTime",
    # inputs
    "Cluster",
    "Parallel",
    "parse_cluster",
    "DeviceProfile",
    "DEVICES",
    "device_profile",
    "Link",
    "NetworkProfile",
    "INTRA_LINKS",
    "INTER_LINKS",
    "network_for",
    "load_profile",
    "parse_rate",
    # collectives
    "Group",
    "collective_time",
    "quangrad_allreduce_time",
    # errors
    "ScaleError",
]
