"""moeinfer.measure_bandwidth on the CPU (host read), its argument errors, and the CUDA request's
error where this build or machine cannot serve it."""

from __future__ import annotations

import math
import os

import pytest

import moeinfer

MIB = 1 << 20
KEYS = {"device", "host_read", "h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable", "bytes", "host_bytes",
        "n_threads", "repetitions"}


def test_cpu_host_read():
    r = moeinfer.measure_bandwidth("cpu", bytes=8 * MIB, host_bytes=8 * MIB, n_threads=2, repetitions=3)
    assert set(r) == KEYS
    assert r["device"] == "cpu"
    assert math.isfinite(r["host_read"]) and 0 < r["host_read"] < 1e5
    assert r["host_bytes"] == 8 * MIB and r["n_threads"] == min(2, len(os.sched_getaffinity(0))) and r["repetitions"] == 3
    # The CPU measures no copies.
    assert r["bytes"] == 0
    assert r["h2d_pinned"] == r["h2d_pageable"] == r["d2h_pinned"] == r["d2h_pageable"] == 0.0


def test_all_cores_by_default():
    r = moeinfer.measure_bandwidth(host_bytes=8 * MIB, repetitions=1)
    assert r["n_threads"] >= 1 and r["host_read"] > 0


@pytest.mark.parametrize("kwargs, needle", [
    ({"device": "tpu"}, "device"),
    ({"bytes": 100}, "bytes"),
    ({"bytes": -1}, "bytes"),
    ({"host_bytes": 5}, "host_bytes"),
    ({"n_threads": -2}, "n_threads"),
    ({"repetitions": 0}, "repetitions"),
])
def test_bad_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        moeinfer.measure_bandwidth(**{"host_bytes": 8 * MIB, **kwargs})


def test_cuda_request():
    kwargs = {"bytes": 8 * MIB, "host_bytes": 8 * MIB, "repetitions": 2}
    if not moeinfer.has_cuda:
        with pytest.raises(NotImplementedError, match="cuda"):
            moeinfer.measure_bandwidth("cuda", **kwargs)
        return
    try:
        r = moeinfer.measure_bandwidth("cuda", **kwargs)
    except RuntimeError as e:  # a CUDA build on a machine without a GPU
        assert "no cuda device" in str(e)
        return
    assert r["bytes"] == 8 * MIB
    for k in ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable"):
        assert math.isfinite(r[k]) and 0 < r[k] < 1e3
