"""Core: what the sources handed back, turned into job state (generations, saves,
clocks, drain), one job at a time, without I/O.
"""
