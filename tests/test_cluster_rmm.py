"""local_cluster's RMM options without a GPU: what reaches LocalCUDACluster (a stand-in that records its
keyword arguments), and every bad argument refused, naming it, before any cluster starts."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types

import pytest

from multireduce import cluster


class _Recorder:
    made: list = []

    def __init__(self, **kwargs):
        type(self).made.append(kwargs)


@pytest.fixture
def fake_gpus(monkeypatch):
    """Four GPUs, dask-cuda whose LocalCUDACluster records its arguments, and rmm importable; returns
    (the recorded calls, a function that makes a package look absent)."""
    calls: list = []

    class LocalCUDACluster(_Recorder):
        made = calls

    fake = types.ModuleType("dask_cuda")
    fake.__spec__ = importlib.machinery.ModuleSpec("dask_cuda", None)
    fake.LocalCUDACluster = LocalCUDACluster
    monkeypatch.setitem(sys.modules, "dask_cuda", fake)
    monkeypatch.setattr(cluster, "gpu_count", lambda: 4)
    absent: set = set()
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name in absent:
            return None
        if name == "rmm":
            return importlib.machinery.ModuleSpec("rmm", None)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return calls, absent.add


@pytest.fixture
def no_cpu_cluster(monkeypatch):
    """A CPU LocalCluster that records its arguments instead of starting."""
    import distributed

    calls: list = []

    class LocalCluster(_Recorder):
        made = calls

    monkeypatch.setattr(distributed, "LocalCluster", LocalCluster)
    return calls


def test_pool_reaches_the_workers_and_cupy_allocates_through_it(fake_gpus):
    calls, _ = fake_gpus
    cluster.local_cluster(n_workers=2, rmm_pool_size="1GiB")
    (kwargs,) = calls
    assert kwargs["rmm_pool_size"] == "1GiB"
    assert kwargs["rmm_allocator_external_lib_list"] == ["cupy"]
    assert kwargs["CUDA_VISIBLE_DEVICES"] == [0, 1] and kwargs["scheduler_port"] == 0
    assert kwargs["host"] == "127.0.0.1"
    assert "rmm_async" not in kwargs and "rmm_managed_memory" not in kwargs


@pytest.mark.parametrize("size", [2**30, 0.5, "24GiB", "512MB"])
def test_pool_sizes_in_dask_cudas_forms(fake_gpus, size):
    calls, _ = fake_gpus
    cluster.local_cluster(rmm_pool_size=size)
    assert calls[-1]["rmm_pool_size"] == size


def test_async_allocator(fake_gpus):
    calls, _ = fake_gpus
    cluster.local_cluster(rmm_async=True)
    (kwargs,) = calls
    assert kwargs["rmm_async"] is True and "rmm_pool_size" not in kwargs
    assert kwargs["rmm_allocator_external_lib_list"] == ["cupy"]


def test_managed_memory_and_libraries_named_by_the_caller_keep_theirs(fake_gpus):
    calls, _ = fake_gpus
    cluster.local_cluster(rmm_managed_memory=True, rmm_allocator_external_lib_list="torch")
    assert calls[-1]["rmm_managed_memory"] is True
    assert calls[-1]["rmm_allocator_external_lib_list"] == ["torch", "cupy"]
    cluster.local_cluster(rmm_pool_size="2GiB", rmm_allocator_external_lib_list=["cupy", "torch"],
                          rmm_maximum_pool_size="4GiB")
    assert calls[-1]["rmm_allocator_external_lib_list"] == ["cupy", "torch"]
    assert calls[-1]["rmm_maximum_pool_size"] == "4GiB"


def test_no_option_takes_rmms_async_allocator_where_rmm_is_installed(fake_gpus):
    calls, absent = fake_gpus
    assert cluster.DEFAULT_RMM == {"rmm_async": True}
    cluster.local_cluster()
    assert calls[-1]["rmm_async"] is True and calls[-1]["rmm_allocator_external_lib_list"] == ["cupy"]
    cluster.local_cluster(rmm_async=False)  # said explicitly: CuPy's own pool
    assert not [k for k, v in calls[-1].items() if k.startswith("rmm_") and v]
    absent("rmm")  # the default without rmm: CuPy's own pool, no error
    cluster.local_cluster()
    assert not [k for k in calls[-1] if k.startswith("rmm_")]
    assert len(calls) == 3


def test_ucx_workers_get_an_rmm_pool_and_a_warning_for_the_async_allocator(fake_gpus):
    """UCX moves arrays GPU to GPU only from memory CUDA IPC can map: with no RMM option named, a UCX
    cluster gets DEFAULT_RMM_UCX (an RMM pool), not the asynchronous allocator; asking for that one with
    UCX warns; CuPy's own pool (rmm_async=False) stays the caller's choice, quietly."""
    import warnings

    calls, absent = fake_gpus
    assert cluster.DEFAULT_RMM_UCX == {"rmm_pool_size": 0.5}
    cluster.local_cluster(protocol="ucx", ucx_on_all_interfaces=True)
    assert calls[-1]["protocol"] == "ucx" and calls[-1]["rmm_pool_size"] == 0.5
    assert "rmm_async" not in calls[-1] and calls[-1]["rmm_allocator_external_lib_list"] == ["cupy"]
    assert calls[-1]["host"] == "127.0.0.1"
    with pytest.warns(RuntimeWarning, match="rmm_pool_size=... or rmm_async=False"):
        cluster.local_cluster(protocol="ucx", ucx_on_all_interfaces=True, rmm_async=True)
    assert calls[-1]["rmm_async"] is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cluster.local_cluster(protocol="ucx", ucx_on_all_interfaces=True, rmm_async=False)
        cluster.local_cluster(protocol="ucx", ucx_on_all_interfaces=True, rmm_pool_size="8GiB")
        cluster.local_cluster(rmm_async=True)  # TCP: the asynchronous allocator is the default, no warning
    assert not [k for k, v in calls[-3].items() if k.startswith("rmm_") and v]
    assert calls[-2]["rmm_pool_size"] == "8GiB"
    absent("rmm")
    cluster.local_cluster(protocol="ucx", ucx_on_all_interfaces=True)  # without rmm: CuPy's own pool
    assert not [k for k in calls[-1] if k.startswith("rmm_")]


def test_no_default_keeps_cupys_pool(fake_gpus, monkeypatch):
    calls, _ = fake_gpus
    monkeypatch.setattr(cluster, "DEFAULT_RMM", None)
    cluster.local_cluster()
    assert not [k for k in calls[-1] if k.startswith("rmm_")]


def test_module_default_applies_only_where_the_call_names_no_option(fake_gpus, monkeypatch):
    calls, _ = fake_gpus
    monkeypatch.setattr(cluster, "DEFAULT_RMM", {"rmm_async": True})
    cluster.local_cluster()
    assert calls[-1]["rmm_async"] is True and calls[-1]["rmm_allocator_external_lib_list"] == ["cupy"]
    cluster.local_cluster(rmm_async=False)  # said explicitly: CuPy's own pool
    assert not [k for k, v in calls[-1].items() if k.startswith("rmm_") and v]
    cluster.local_cluster(rmm_pool_size="1GiB")
    assert calls[-1]["rmm_pool_size"] == "1GiB" and "rmm_async" not in calls[-1]


def test_module_default_is_checked_too(fake_gpus, monkeypatch):
    calls, _ = fake_gpus
    monkeypatch.setattr(cluster, "DEFAULT_RMM", {"rmm_pool": "1GiB"})
    with pytest.raises(ValueError, match="DEFAULT_RMM.*'rmm_pool'"):
        cluster.local_cluster()
    monkeypatch.setattr(cluster, "DEFAULT_RMM", {"rmm_async": "yes"})
    with pytest.raises(TypeError, match="DEFAULT_RMM.*'rmm_async'"):
        cluster.local_cluster()
    assert not calls


@pytest.mark.parametrize("kwargs, error, named", [
    ({"rmm_pool_size": 0}, ValueError, "'rmm_pool_size'"),
    ({"rmm_pool_size": -5}, ValueError, "'rmm_pool_size'"),
    ({"rmm_pool_size": 1.5}, ValueError, "'rmm_pool_size'"),
    ({"rmm_pool_size": True}, ValueError, "'rmm_pool_size'"),
    ({"rmm_pool_size": "lots"}, ValueError, "'rmm_pool_size'"),
    ({"rmm_pool_size": [1]}, ValueError, "'rmm_pool_size'"),
    ({"rmm_async": "yes"}, TypeError, "'rmm_async'"),
    ({"rmm_managed_memory": 1}, TypeError, "'rmm_managed_memory'"),
    ({"rmm_async": True, "rmm_managed_memory": True}, ValueError, "'rmm_managed_memory=True'"),
    ({"rmm_async": True, "rmm_pool_size": "1GiB"}, ValueError, "'rmm_pool_size'"),
])
def test_bad_options_are_named_before_anything_starts(fake_gpus, monkeypatch, kwargs, error, named):
    calls, _ = fake_gpus

    def no_probe():
        raise AssertionError("a bad argument must be refused before looking for GPUs")

    monkeypatch.setattr(cluster, "gpu_count", no_probe)
    with pytest.raises(error, match=named):
        cluster.local_cluster(**kwargs)
    assert not calls


def test_missing_rmm_names_the_package_and_the_install_line(fake_gpus):
    calls, absent = fake_gpus
    absent("rmm")
    with pytest.raises(RuntimeError, match=r"rmm_async=True.*pip install rmm-cu1[23]"):
        cluster.local_cluster(rmm_async=True)
    assert not calls
    cluster.local_cluster()  # without RMM options rmm is not needed
    assert len(calls) == 1


def test_cpu_clusters_refuse_rmm_options(fake_gpus, no_cpu_cluster, monkeypatch):
    calls, absent = fake_gpus
    with pytest.raises(ValueError, match=r"rmm_pool_size='1GiB'.*gpu=False"):
        cluster.local_cluster(gpu=False, rmm_pool_size="1GiB")
    with pytest.raises(ValueError, match=r"rmm_release_threshold.*gpu=False"):
        cluster.local_cluster(gpu=False, rmm_release_threshold="1GiB")
    monkeypatch.setattr(cluster, "gpu_count", lambda: 0)
    with pytest.raises(ValueError, match=r"rmm_async=True.*no CUDA GPU"):
        cluster.local_cluster(rmm_async=True)
    monkeypatch.setattr(cluster, "gpu_count", lambda: 4)
    absent("dask_cuda")
    with pytest.raises(ValueError, match=r"rmm_managed_memory=True.*dask-cuda is not installed"):
        cluster.local_cluster(rmm_managed_memory=True)
    assert not calls and not no_cpu_cluster
    cluster.local_cluster(gpu=False, rmm_async=False)  # asks for no RMM: a CPU cluster as before
    assert len(no_cpu_cluster) == 1 and not [k for k in no_cpu_cluster[0] if k.startswith("rmm_")]


def test_module_default_never_reaches_cpu_clusters(no_cpu_cluster, monkeypatch):
    monkeypatch.setattr(cluster, "DEFAULT_RMM", {"rmm_pool_size": "1GiB"})
    monkeypatch.setattr(cluster, "gpu_count", lambda: 0)
    cluster.local_cluster(n_workers=1)
    assert not [k for k in no_cpu_cluster[0] if k.startswith("rmm_")]


def test_install_hint_follows_cupys_cuda(monkeypatch):
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(
        runtimeGetVersion=lambda: 12080)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert cluster._rmm_install_hint() == "pip install rmm-cu12"
    monkeypatch.setitem(sys.modules, "cupy", None)  # no CuPy: both lines
    assert "rmm-cu13" in cluster._rmm_install_hint() and "rmm-cu12" in cluster._rmm_install_hint()


def test_a_ucx_cluster_is_refused_unless_its_exposure_is_accepted(fake_gpus):
    """distributed-ucxx's listeners bind every interface whatever host is given, with no authentication:
    refused before anything starts unless the caller says only trusted hosts reach the machine."""
    calls, _ = fake_gpus
    before = len(calls)
    for asked in ({"protocol": "ucx"}, {"protocol": "ucx://"}, {"protocol": "ucxx"}, {"host": "ucx://127.0.0.1"},
                  {"host": "ucxx://127.0.0.1"}, {"scheduler_kwargs": {"protocol": "ucx"}},
                  {"worker_kwargs": {"protocol": "UCX"}}):
        with pytest.raises(ValueError, match="ucx_on_all_interfaces=True"):
            cluster.local_cluster(**asked)
    with pytest.raises(TypeError, match="ucx_on_all_interfaces"):
        cluster.local_cluster(protocol="ucx", ucx_on_all_interfaces="yes")
    assert len(calls) == before  # nothing started
    cluster.local_cluster(protocol="ucx", ucx_on_all_interfaces=True)
    assert calls[-1]["protocol"] == "ucx" and "ucx_on_all_interfaces" not in calls[-1]
    cluster.local_cluster(protocol="tcp")  # loopback TCP needs nothing
