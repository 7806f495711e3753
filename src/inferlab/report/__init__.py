"""Formatting only: the console progress line and summary table.
"""
