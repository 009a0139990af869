"""The base: what every app and the project shell use, importing none of them.

Egress (the outbound policy), credentials (names, destinations, redaction), telemetry, the
worker's connection pool, the database URL, the embedded PostgreSQL, logging, the error type and
its codes (exceptions), who acts (actors) and bounded numbers. Plain Python and Django; no models.
"""
