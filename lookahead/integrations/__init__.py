"""Adapters to other libraries' generation loops."""
