"""Per-server physical-core sets for benchmarks that serve several configurations at once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmark"))

from sweeplib import cpu_sets  # noqa: E402


def smt_pairs(cpu: int) -> list[int]:
    """16 CPUs as Linux numbers them on a two-way SMT machine: cpu i and i + 8 share a core."""
    return [cpu % 8, cpu % 8 + 8]


def test_linux_cpu_lists_parse() -> None:
    assert cpu_sets.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert cpu_sets.parse_cpu_list("5") == [5]


def test_siblings_stay_together_and_no_core_is_shared() -> None:
    cores = cpu_sets.physical_cores(list(range(16)), smt_pairs)
    assert cores[:2] == [[0, 8], [1, 9]] and len(cores) == 8
    servers, client = cpu_sets.split_cores(cores, 2)
    assert servers == [{0, 1, 2, 8, 9, 10}, {3, 4, 5, 11, 12, 13}]
    assert client == {6, 7, 14, 15}
    for core in cores:
        owners = [i for i, cpus in enumerate(servers + [client]) if set(core) & cpus]
        assert len(owners) == 1 and set(core) <= (servers + [client])[owners[0]]


def test_only_allowed_cpus_are_handed_out() -> None:
    cores = cpu_sets.physical_cores([0, 1, 2, 8], smt_pairs)
    assert cores == [[0, 8], [1], [2]]


def test_too_few_cores_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot give 2 servers"):
        cpu_sets.split_cores([[0], [1]], 2)
