"""horde_store."""
