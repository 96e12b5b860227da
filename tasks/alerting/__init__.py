"""Alerts: what an alert is, the incident ledger, delivery to the channels installed in this process."""
