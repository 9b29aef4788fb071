"""Plugins: UPS sources, platforms and cache providers, each family behind one Protocol."""
