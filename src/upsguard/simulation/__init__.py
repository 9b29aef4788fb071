"""The dry run: the engine on a virtual clock against a battery model and simulated plugins,
its report, and the demo."""
