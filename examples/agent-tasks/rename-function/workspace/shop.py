"""Prices of a basket."""


def calc_total(prices, discount=0.0):
    """The sum of `prices`, less `discount` (a fraction), rounded to cents."""
    return round(sum(prices) * (1 - discount), 2)
