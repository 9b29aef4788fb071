"""Runbooks: the resource graph, shutdown and startup plans, the executor, the simulator."""
