"""``python -m upsguard``: the same as the ``upsguard`` command."""

import sys

from upsguard.cli import main

sys.exit(main())
