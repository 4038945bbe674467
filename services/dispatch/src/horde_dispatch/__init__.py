"""horde_dispatch."""
