"""Demo: the product on an embedded default; nothing in the daemon imports it."""
