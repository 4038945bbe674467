"""horde_submit."""
