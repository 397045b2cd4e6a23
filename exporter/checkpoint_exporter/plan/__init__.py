"""Plan: the sizing worksheet."""
