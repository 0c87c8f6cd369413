"""The command line and everything user-facing."""
