"""horde_testing."""
