"""The ``inferlab`` command: parse flags, build a frozen config, call the library, render.
"""
