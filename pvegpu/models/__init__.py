"""Data shapes: pydantic specs for what operators declare, frozen dataclasses for what hosts are."""
