"""upsguard: UPS-aware cache policy and orderly shutdown controller for virtualized datacenters."""

__version__ = "0.1.0"

__all__ = ["__version__"]
