"""The control API (Litestar) under /api/v1, and the health and readiness probes."""
