"""The engine: the outage controller (readings -> phases -> decisions -> runs), the executor
that carries a plan out step by step, what one step does, cache destage, health checks."""
