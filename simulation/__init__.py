"""Deterministic simulation of the protocol and a history checker (issue 40, parts 3 and 4).

A development tool, not part of the shipped distribution: ``make simulate`` and the tests run it.
"""
