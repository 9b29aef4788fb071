"""The service only (``upsguard run``): the composition root, journal, local API, resume,
overrides, metrics and notifications."""
