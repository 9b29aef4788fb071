"""Reports for people: the retrospective of a run (real or simulated) and the printable run
book, as self-contained HTML (inline SVG charts, no network: the power may be out) or
Markdown.

The controller builds a ``Story`` from the journal, the simulation adds what only a dry run
knows; one renderer draws both. Nothing here reads the journal or runs anything.
"""

FORMATS = ("html", "md")
"""What a report or run book is rendered as (``render``); here, where the CLI's parser reads
it without importing the renderer."""
