"""TTL and retention sweeper: finds what is due and publishes expiry events; the projector deletes."""
