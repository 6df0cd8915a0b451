"""`make test`'s queue (tests/conftest.py balanced_order): the groups first, the slow tests longest first at the
start of the second worker's half, quick tests at the end of both halves, so that what one worker steals from the
other at the end of a run is short."""
import pytest
from conftest import balanced_order


class FakeItem:
    """What balanced_order reads of a pytest item: its marks."""

    def __init__(self, name: str, *marks: pytest.MarkDecorator) -> None:
        self.name = name
        self.marks = [mark.mark for mark in marks]

    def iter_markers(self, name: str):
        return (mark for mark in self.marks if mark.name == name)

    def get_closest_marker(self, name: str):
        return next(self.iter_markers(name), None)


def test_groups_come_first_then_the_slow_tests_longest_first_from_the_middle():
    items = [FakeItem(f"quick{i}") for i in range(6)] + [
        FakeItem("slow-default", pytest.mark.slow), FakeItem("slow-30", pytest.mark.slow(seconds=30)),
        FakeItem("grouped-b", pytest.mark.xdist_group("b")), FakeItem("slow-8", pytest.mark.slow(seconds=8)),
        FakeItem("grouped-a", pytest.mark.xdist_group("a")), FakeItem("grouped-b2", pytest.mark.xdist_group("b"))]
    order = [item.name for item in balanced_order(items, {"b": 0, "a": 1})]
    assert order == ["grouped-b", "grouped-b2", "grouped-a", "quick0", "quick1", "quick2",
                     "slow-30", "slow-8", "slow-default", "quick3", "quick4", "quick5"]
    assert order.index("slow-30") == len(items) // 2  # the second worker starts on the longest


def test_groups_longer_than_half_the_queue_leave_no_quick_test_before_the_slow_ones():
    items = [FakeItem(f"grouped{i}", pytest.mark.xdist_group("g")) for i in range(5)] + [
        FakeItem("quick"), FakeItem("slow", pytest.mark.slow(seconds=12))]
    assert [item.name for item in balanced_order(items, {"g": 0})][-2:] == ["slow", "quick"]
