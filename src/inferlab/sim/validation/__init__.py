"""The simulator against published measurements: calibration CSV rows read as
scenarios, run in virtual time, compared with what their sources measured.
"""
