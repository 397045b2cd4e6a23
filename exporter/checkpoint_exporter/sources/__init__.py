"""Sources: what reads the world (directory trees, inotify, the event spool,
checkpoint metadata, node telemetry) and hands back plain values.
"""
