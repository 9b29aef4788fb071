"""A UPS with an SNMP card, through pysnmp's asyncio API (v1, v2c, v3 authPriv).

Two MIBs map onto NUT's status words, so the layers above see one kind of reading: the
standard UPS-MIB (RFC 1628) and APC PowerNet (``readings``). upsguard's NUT-style commands
at the end of a shutdown become SETs of each MIB's control objects (``control``). With a
``trap_port`` in the site file, the UPS's traps ask for a poll at once (``traps``). The
polls of every SNMP UPS share one SNMP engine per event loop (``engine``).
"""

from upsguard.plugins.ups.snmp.engine import auth_data
from upsguard.plugins.ups.snmp.readings import (
    APC,
    POWERNET_OIDS,
    UPS_MIB,
    UPS_MIB_OIDS,
    powernet_reading,
    ups_mib_reading,
)
from upsguard.plugins.ups.snmp.source import SnmpSource

__all__ = [
    "APC",
    "POWERNET_OIDS",
    "UPS_MIB",
    "UPS_MIB_OIDS",
    "SnmpSource",
    "auth_data",
    "powernet_reading",
    "ups_mib_reading",
]
