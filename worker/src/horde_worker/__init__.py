"""horde_worker."""
