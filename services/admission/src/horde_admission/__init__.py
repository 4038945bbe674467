"""horde_admission."""
