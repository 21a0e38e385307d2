"""Defines functions but no TOOLS list."""


def add(a, b):
    return a + b
