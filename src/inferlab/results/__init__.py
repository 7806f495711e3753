"""What a run leaves behind: raw per-request records, the metrics computed from them
(pure functions), the typed summary, and the run directory's files.
"""
