"""Small helpers for ranges of integers."""


def inclusive_range(start, stop):
    """The integers from start to stop, both included: inclusive_range(2, 5) == [2, 3, 4, 5]."""
    return list(range(start, stop))


def count_between(start, stop):
    """How many integers inclusive_range(start, stop) holds."""
    return len(inclusive_range(start, stop))
