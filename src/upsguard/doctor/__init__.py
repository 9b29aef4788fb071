"""Knowing before the outage: ``upsguard doctor`` and ``upsguard drill``.

``checkup`` runs every check of a site (each UPS, platform, resource, cache, the files the
site names, the journal, notifications on request, the live plan), several at once, each
within its own time, and never changes anything on the site; the plugins check themselves
through their family's optional ``diagnose``. ``changes`` says what broke since an earlier
checkup (the service's scheduled checks notify it). ``drill`` rehearses the shutdown plan
read-only: each step's targets resolved, their state read and timed, what would act and what
would fail.
"""
