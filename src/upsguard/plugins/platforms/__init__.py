"""Platforms: what powers resources off and on (vSphere, BMCs, SSH, commands, simulated)."""
