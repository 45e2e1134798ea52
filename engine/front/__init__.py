"""Every way in: the front door (door.py: loose settings -> GenerationParams, several requests followed as one), the
checks of a request that need only the config (checks.py), the Serving protocol an Engine and its replicas
offer (serving.py), and the Prometheus metrics (metrics.py). Talks to an engine through Serving, never Engine."""
