"""horde_oai."""
