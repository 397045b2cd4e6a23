"""Daemon: the core thread, its timers and the per-filesystem workers that run the
sources and the core, and publish snapshots.
"""
