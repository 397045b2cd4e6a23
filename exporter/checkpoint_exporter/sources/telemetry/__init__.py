"""Node telemetry sampled into bounded ring buffers, so each save window can be correlated.

Prometheus advises exporters against their own timers; this one needs samples *inside* each
checkpoint window, so it samples (sampler.py) and exports only values derived per window
(correlate.py) plus filesystem capacity. Each source reads sysfs/procfs below the configured
``--path.sysfs`` / ``--path.procfs``; capacity is statvfs of the mountpoints behind the watched
paths, as the exporter's own mount table names them (filesystem.py), run by the daemon on each
mount's worker (daemon/health.py), not by the sampler.
"""
