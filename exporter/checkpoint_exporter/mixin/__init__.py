"""Mixin: alert and recording rules and dashboards, generated from one config."""
