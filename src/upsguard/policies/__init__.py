"""Policies: what the readings mean (feeds, depletion) and when the site changes phase."""
