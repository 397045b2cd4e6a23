"""``python -m checkpoint_exporter`` is the ``checkpoint-exporter`` command."""

import sys

from checkpoint_exporter.cli import main

sys.exit(main())
