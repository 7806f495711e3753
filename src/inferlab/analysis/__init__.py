"""Explaining a workload or a run: the token cost of templates and system prompts.
"""
