"""Agent environments and the tools they expose."""
