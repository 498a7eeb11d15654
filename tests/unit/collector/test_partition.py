"""``collector.exporters.partition``: the same partitions as Kafka's default partitioner."""

from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as reference_murmur2
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.exporters.partition import KeyPartitioner, murmur2

# Known values of the Java client's Utils.murmur2 (its own unit test vectors), as signed ints.
_JAVA = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def _signed(h: int) -> int:
    return h - (1 << 32) if h >= 1 << 31 else h


def test_the_java_clients_vectors() -> None:
    for key, expected in _JAVA.items():
        assert _signed(murmur2(key)) == expected, key


@settings(max_examples=2000)
@given(st.binary(max_size=200))
def test_equal_to_aiokafkas_murmur2(data: bytes) -> None:
    assert murmur2(data) == reference_murmur2(data)


@given(st.binary(min_size=1, max_size=80), st.integers(min_value=1, max_value=64))
def test_same_partition_as_aiokafkas_default_partitioner(key: bytes, n: int) -> None:
    parts = list(range(n))
    assert KeyPartitioner()(key, parts, parts) == DefaultPartitioner()(key, parts, parts)


def test_a_record_without_a_key_goes_to_an_available_partition() -> None:
    p = KeyPartitioner()
    assert {p(None, [0, 1, 2, 3], [2]) for _ in range(50)} == {2}
    assert {p(None, [0, 1], []) for _ in range(200)} == {0, 1}
