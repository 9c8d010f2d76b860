"""cotal-trio: the auth service for NATS-based agent meshes (auth callout + token exchange), on trio."""

__version__ = "0.1.0"
