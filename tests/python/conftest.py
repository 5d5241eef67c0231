"""Fixtures: real tether clusters and processes (tether_cluster.py), all
killed at teardown, their logs' tails printed (shown when a test fails)."""

import sys

import pytest

from tether_cluster import Cluster, Registry, python_env


@pytest.fixture
def registry(tmp_path):
    r = Registry(tmp_path)
    yield r
    r.teardown()


@pytest.fixture
def cluster(registry, tmp_path):
    """cluster(shards=1, workers=1, flags=(), shard_flags=(), data_dir=False)
    -> a running Cluster; flags go to shard 0 (the run's settings),
    shard_flags to every shard."""

    started = 0

    def start(shards=1, workers=1, flags=(), shard_flags=(), data_dir=False):
        # A second cluster of the same test gets a directory of its own:
        # log names are per directory, and its shards' "listening on" lines
        # must not be read from the first one's logs.
        nonlocal started
        started += 1
        directory = tmp_path
        if started > 1:
            directory = tmp_path / f"cluster{started}"
            directory.mkdir()
        return Cluster(registry, directory, shards, workers, flags,
                       shard_flags, data_dir)

    return start


@pytest.fixture
def spawn(registry, tmp_path):
    """spawn(argv, name) -> Process logging to tmp_path/name.log;
    spawn.python(script, name, *args) runs Python code (a string) with
    this interpreter and package."""

    def run(argv, name, env=None):
        return registry.start(argv, tmp_path / f"{name}.log", env=env)

    def python(script, name, *args):
        return registry.start([sys.executable, "-c", script, *args],
                              tmp_path / f"{name}.log", env=python_env())

    def module(args, name):
        return registry.start([sys.executable, *args],
                              tmp_path / f"{name}.log", env=python_env())

    run.python = python
    run.module = module
    return run

