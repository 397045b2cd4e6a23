"""checkpoint-exporter: is every training job's state reaching recoverable storage in time?

This module deliberately imports nothing: ``checkpoint_exporter.instrument`` must run inside
training images that carry only the standard library.
"""

__version__ = "0.1.0"
