"""horde_core."""
