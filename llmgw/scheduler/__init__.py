"""Scheduler backends: what makes the catalog run (Nomad, or child processes locally)."""
