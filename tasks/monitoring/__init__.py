"""Monitoring: new data and live behaviour judged against the champion (drift, live metrics, the monitor)."""
