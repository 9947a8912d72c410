"""Integrations with web frameworks (each needs its framework installed; importing ``ringfence`` loads none)."""
