"""horde_janitor."""
