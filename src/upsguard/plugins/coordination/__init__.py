"""The coordination store of a controller pair: leadership and the shared run ledger."""
