"""UPS sources: NUT, SNMP, simulated."""
