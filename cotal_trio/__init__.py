"""cotal-trio: the auth service for NATS-based agent meshes (auth callout + token exchange), on trio.

Public API (besides the ``cotal`` command line):

* :func:`admits_service_endpoints` (trio-flavoured): does a space admit service endpoints, so
  that a callout-only replica refuses it? (spec "Callout replicas"; upstream
  ``admitsServiceEndpoints`` of ``@cotal-ai/auth``). Imported on first use, so ``import
  cotal_trio`` (and every CLI command) stays free of the NATS stack.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cotal_trio.lane.service_endpoints import admits_service_endpoints

__all__ = ["__version__", "admits_service_endpoints"]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """PEP 562: the lazy exports."""
    if name == "admits_service_endpoints":
        from cotal_trio.lane.service_endpoints import admits_service_endpoints

        return admits_service_endpoints
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
