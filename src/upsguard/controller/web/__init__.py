"""The live status page: the outage as it happens, in a browser, for the people watching it.

``upsguard run`` serves it on a listener of its own when the site file has a ``web:``
section (docs/web.md); the local API and its socket are untouched. Modules by process:
``server`` (the listener, routes and the request guards), ``auth`` (passwords, signed
session cookies, CSRF, slowed logins, the reverse proxy's header), ``live`` (one status
per change, pushed to every browser by server-sent events), ``pages`` (the HTML, through
Jinja2), ``controls`` (hold, release, trigger, abort), ``history`` (the journal's readings
as pygal charts) and ``doctor`` (the last health check's panel).
"""
