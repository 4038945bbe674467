"""horde_contract."""
