"""The service only (``upsguard run``): the composition root, journal, local API, resume,
overrides, metrics and notifications; and ``commands``, the override commands' requests
and answers, which the CLI shares (it imports nothing heavier: keep this file empty)."""
