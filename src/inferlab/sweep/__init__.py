"""Sweeps: many runs over a grid of load, workload and engine settings, each a normal run
directory under one sweep directory indexed by ``sweep.json``; a saturation stop per load
axis, a goodput search for the highest rate meeting SLOs, and repeats with confidence
intervals."""
