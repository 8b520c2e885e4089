"""Algorithms built on evorl_pop, one readable file each.

Installed as ``evorl_pop.algorithms``.
"""
